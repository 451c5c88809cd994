"""Attention on torch: the target's attention mixer (over its KV cache) and the drafter's attention (over the
draft KV's stores).

The target's cache keeps llama.cpp's layout (keys (n_kv, capacity, d), values transposed (n_kv, d, capacity))
in f16 or f32 tensors on the device; a query at position p sees cache positions <= p (and, in a sliding-window
layer of n, those > p - n). The drafter's queries see the rows the draft KV lists for them, by absolute
position: non-causal unless the drafter says causal, |q - k| < window in sliding layers (z-lab's mask).
"""

import numpy as np
import torch

from ggtools.runtime.target.pieces import AttentionTensors
from ggtools.runtime.torch_backend import tensor_math
from ggtools.runtime.torch_backend.matrix import DeviceGroup
from ggtools.runtime.torch_backend.vectors import device_vector, optional_device_vector


def causal_visibility(q_positions, n_ctx: int, window: int, device) -> torch.Tensor:
    """(T, n_ctx) bool: key s visible to the query at position p iff s <= p and (no window or s > p - window)."""
    p = torch.as_tensor(np.asarray(q_positions, np.int64), device=device)[:, None]
    s = torch.arange(n_ctx, device=device)[None]
    visible = s <= p
    return visible & (s > p - window) if window else visible


class Attention(AttentionTensors):
    """The attention mixer: projections (+ biases), per-head q/k norms, RoPE, the cache write, attention over the
    cache (sliding window, sinks), sigmoid output gate (qwen35), output projection (+ bias). Runs tree batches
    (kv.tree: each row sees the cache before the tree and its own path)."""

    tree_verify = True

    def __post_init__(self):
        self.qkv = DeviceGroup(self.wq, self.wk, self.wv)
        device = self.wq.blocks.device
        self.bq, self.bk, self.bv, self.bo = (optional_device_vector(b, device) for b in (self.bq, self.bk, self.bv,
                                                                                        self.bo))
        self.q_norm, self.k_norm, self.sinks = (device_vector(v, device) for v in (self.q_norm, self.k_norm,
                                                                                  self.sinks))

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> torch.Tensor:
        n_tokens = h.shape[0]
        q, k, v = self.qkv(h)
        q, k, v = (x if b is None else x + b.to(x.dtype) for x, b in ((q, self.bq), (k, self.bk), (v, self.bv)))
        if self.output_gate:
            heads = q.reshape(n_tokens, hp.n_head, 2, hp.head_dim)
            q, gate = heads[:, :, 0].reshape(n_tokens, -1), heads[:, :, 1].reshape(n_tokens, -1)
        q = tensor_math.norm_rope(q, hp.n_head, self.q_norm, hp.rms_eps, rope, hp.rope_neox)
        k = tensor_math.norm_rope(k, hp.n_head_kv, self.k_norm, hp.rms_eps, rope, hp.rope_neox)
        start, n_ctx = int(positions[0]), int(positions[0]) + n_tokens
        keys, values_t = kv.k[slot], kv.v[slot]
        keys[:, start:n_ctx] = k.transpose(0, 1).to(keys.dtype)
        values_t[:, :, start:n_ctx] = v.reshape(n_tokens, hp.n_head_kv, hp.head_dim).permute(1, 2, 0).to(keys.dtype)
        visible = causal_visibility(positions, n_ctx, self.window, h.device) if kv.tree is None else \
            torch.as_tensor(kv.tree.visible(self.window), device=h.device)
        f16_operands = keys.dtype == torch.float16 and h.dtype == torch.float32
        out = tensor_math.attend(q, keys[:, :n_ctx], values_t[:, :, :n_ctx].transpose(1, 2), visible,
                                 hp.attn_scale, self.sinks, f16_operands)
        if self.output_gate:
            out = out * torch.sigmoid(gate)
        out = self.wo(out)
        return out if self.bo is None else out + self.bo.to(out.dtype)


def draft_attention(q, k_store, v_store, rows, k_pos, q_pos, scale: float, window: int = 0,
                    causal: bool = False) -> torch.Tensor:
    """(T, n_head, d) queries at q_pos over the keys at rows `rows` of the (rows, n_kv, d) stores (positions
    k_pos) -> (T, n_head * d)."""
    device = q.device
    index = torch.as_tensor(np.asarray(rows, np.int64), device=device)
    keys, values = (store.data[index].transpose(0, 1) for store in (k_store, v_store))     # (n_kv, S, d)
    kp = torch.as_tensor(np.asarray(k_pos, np.int64), device=device)[None]
    qp = torch.as_tensor(np.asarray(q_pos, np.int64), device=device)[:, None]
    visible = torch.ones((qp.shape[0], kp.shape[1]), dtype=torch.bool, device=device)
    if causal:
        visible &= kp <= qp
    if window:
        visible &= (qp - kp).abs() < window
    return tensor_math.attend(q, keys, values, visible, scale)
