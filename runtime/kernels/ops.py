"""RMS norm, RoPE and SwiGLU as llama.cpp's CPU backend computes them (see ggmlmath for why exactly).

- rms_norm: squares summed in float64 (ggml_float), scale 1/sqrtf(mean + eps) in float32;
- RoPE: angles from repeated float32 multiplication theta *= theta_scale (ggml's rope cache), libm
  cosf/sinf/powf (numba calls the same C library), pairs (i, i + n/2) for NeoX, (2i, 2i+1) otherwise;
- SwiGLU and SiLU: ggml_v_silu on 8-value chunks, libm expf on the leftovers;
- sigmoid: 1 / (1 + expf(-x)) with libm expf (ggml's unary op);
- M-RoPE on text: each pair's angle comes from one of four position ids; text tokens have the first three
  equal to the position and the fourth 0, so pairs of the fourth section do not rotate.
"""

import numpy as np
from numba import njit

from ggtools.runtime.kernels.ggmlmath import EXACT, fma, silu

F32 = np.float32


@njit(**EXACT)
def rms_norm_row(x, weight, eps, out):
    n = x.size
    total = np.float64(0.0)
    for i in range(n):
        total += np.float64(x[i] * x[i])
    mean = np.float32(total / n)
    scale = np.float32(1.0) / np.sqrt(mean + eps)
    for i in range(n):
        out[i] = (x[i] * scale) * weight[i]


@njit(**EXACT)
def rms_norm_rows(x, weight, eps, out):
    for r in range(x.shape[0]):
        rms_norm_row(x[r], weight, eps, out[r])


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Over the last axis: x / sqrt(mean(x^2) + eps) * weight."""
    rows = np.ascontiguousarray(x, F32).reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    rms_norm_rows(rows, np.ascontiguousarray(weight, F32), F32(eps), out)
    return out.reshape(x.shape)


@njit(**EXACT)
def rope_angles(positions, n_dims, base, freq_scale, freq_factors):
    """cos, sin (len(positions), n_dims // 2) as ggml_rope_cache_init computes them (no YaRN)."""
    theta_scale = np.power(np.float32(base), np.float32(-2.0) / np.float32(n_dims))
    cos = np.empty((positions.size, n_dims // 2), np.float32)
    sin = np.empty((positions.size, n_dims // 2), np.float32)
    for t in range(positions.size):
        theta = np.float32(positions[t])
        for i in range(n_dims // 2):
            ff = freq_factors[i] if freq_factors.size else np.float32(1.0)
            angle = freq_scale * (theta / ff)
            cos[t, i] = np.cos(angle)
            sin[t, i] = np.sin(angle)
            theta = theta * theta_scale
    return cos, sin


@njit(**EXACT)
def rope_head(x, cos, sin, neox):
    """Rotate the first 2 * len(cos) dims of one head in place."""
    half = cos.size
    for i in range(half):
        a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
        x0, x1 = x[a], x[b]
        x[a] = fma(x0, cos[i], -(x1 * sin[i]))
        x[b] = fma(x0, sin[i], x1 * cos[i])


@njit(**EXACT)
def swiglu_rows(gate, up, out):
    n = gate.shape[1]
    for r in range(gate.shape[0]):
        n_main = n // 8 * 8
        for i in range(n_main):
            out[r, i] = silu(gate[r, i]) * up[r, i]
        for i in range(n_main, n):
            g = gate[r, i]
            out[r, i] = g / (np.float32(1.0) + np.exp(-g)) * up[r, i]


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up."""
    out = np.empty_like(gate)
    swiglu_rows(gate, up, out)
    return out


@njit(**EXACT)
def silu_rows(x, out):
    """ggml_vec_silu_f32 on each row of x (T, n): ggml_v_silu on 8-value chunks, libm expf on the leftovers."""
    n = x.shape[1]
    n_main = n // 8 * 8
    for r in range(x.shape[0]):
        for i in range(n_main):
            out[r, i] = silu(x[r, i])
        for i in range(n_main, n):
            out[r, i] = x[r, i] / (F32(1.0) + np.exp(-x[r, i]))


@njit(**EXACT)
def sigmoid(x):
    return F32(1.0) / (F32(1.0) + np.exp(-x))


@njit(**EXACT)
def sigmoid_rows(x, out):
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[r, i] = sigmoid(x[r, i])


def fourth_section_pairs(n_pairs: int, sections, interleaved: bool) -> np.ndarray:
    """Which of the n_pairs rotated pairs ggml_mrope_cache_init gives the fourth position id (the extra one,
    0 for text tokens): interleaved (IMROPE, qwen35) assigns pair i by (i % sum) % 3 within 3 * section
    bounds; otherwise the sections follow each other."""
    s0, s1, s2, s3 = sections
    sector = np.arange(n_pairs) % (s0 + s1 + s2 + s3)
    if interleaved:
        return ~(((sector % 3 == 0) & (sector < 3 * s0)) | ((sector % 3 == 1) & (sector < 3 * s1)) |
                 ((sector % 3 == 2) & (sector < 3 * s2)))
    return sector >= s0 + s1 + s2


def text_rope_angles(cos: np.ndarray, sin: np.ndarray, sections, interleaved: bool) -> tuple:
    """M-RoPE cos/sin tables of text tokens from plain RoPE's (rope_angles): pairs of the fourth section
    get angle 0."""
    still = fourth_section_pairs(cos.shape[1], sections, interleaved)
    cos, sin = cos.copy(), sin.copy()
    cos[:, still], sin[:, still] = 1.0, 0.0
    return cos, sin
