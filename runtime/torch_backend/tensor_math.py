"""The graph's math on torch tensors: RMS norm, RoPE, SwiGLU and its clamped variant, attention with masks and sinks.

Float32 tensors (the compute dtype f32) get llama.cpp's CPU arithmetic operation for operation (ggml_math.py),
as the numba runtime computes it. In bf16 / f16 (a GPU's fast path) norms, softmax and attention compute in
float32 with torch's own functions (their inputs upcast, their outputs cast back), as llama.cpp's GPU backends
keep them; matmuls run in the compute dtype (matrix.py).
"""

import torch
import torch.nn.functional as F

from ggtools.runtime.torch_backend import ggml_math

F32 = torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Over the last axis: x / sqrt(mean(x^2) + eps) * weight."""
    if x.dtype == F32:
        return ggml_math.rms_norm(x, weight, eps)
    xf = x.to(F32)
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotate the first 2 * cos.shape[-1] dims of each head. x: (T, heads, d); cos, sin: (T, n_rot / 2)."""
    if x.dtype == F32:
        return ggml_math.rope(x, cos, sin, neox)
    half = cos.shape[-1]
    xf = x.to(F32)
    if neox:
        a, b = xf[..., :half], xf[..., half:2 * half]
    else:
        a, b = xf[..., 0:2 * half:2], xf[..., 1:2 * half:2]
    c, s = cos[:, None], sin[:, None]
    ra, rb = a * c - b * s, a * s + b * c
    rotated = torch.cat([ra, rb], -1) if neox else torch.stack([ra, rb], -1).flatten(-2)
    return torch.cat([rotated, xf[..., 2 * half:]], -1).to(x.dtype)


def norm_rope(x: torch.Tensor, n_heads: int, norm: torch.Tensor, eps: float, tables, neox: bool = True):
    """q or k projections (T, heads * d) -> per-head RMS-normed (unless norm is empty), rotated (T, heads, d)."""
    heads = x.reshape(x.shape[0], n_heads, -1)
    return rope(rms_norm(heads, norm, eps) if norm.numel() else heads, *tables, neox)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if gate.dtype == F32:
        return ggml_math.swiglu(gate, up)
    return F.silu(gate) * up


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU (ggml_swiglu_oai): x = min(gate, limit), y = clamp(up, +-limit),
    x * sigmoid(alpha x) * (y + 1)."""
    if gate.dtype == F32:
        return ggml_math.swiglu_oai(gate, up, alpha, limit)
    x, y = gate.clamp(max=limit), up.clamp(-limit, limit)
    return x * torch.sigmoid(alpha * x) * (y + 1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """GQA attention in float32 with torch's functions (the bf16 / f16 path). q: (T, n_head, d); k, v: (n_kv, S,
    d); visible: (T, S) bool; sinks: one extra logit per head that takes part in the softmax but not in the
    output (gpt-oss). -> (T, n_head * d) in q's dtype."""
    n_tokens, n_head, d = q.shape
    n_kv = k.shape[0]
    group = n_head // n_kv
    qf = q.to(F32)
    qg = qf.reshape(n_tokens, n_kv, group, d).permute(1, 2, 0, 3)              # (n_kv, group, T, d)
    scores = torch.matmul(qg, k.to(F32)[:, None].transpose(-1, -2)) * scale     # (n_kv, group, T, S)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None and sinks.numel():
        sink = sinks.reshape(n_kv, group, 1, 1).expand(n_kv, group, n_tokens, 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    out = torch.matmul(probs, v.to(F32)[:, None])                               # (n_kv, group, T, d)
    return out.permute(2, 0, 1, 3).reshape(n_tokens, n_head * d).to(q.dtype)
