"""RMS norm, RoPE and SwiGLU as llama.cpp's CPU backend computes them (see ggmlmath for why exactly).

- rms_norm: squares summed in float64 (ggml_float), scale 1/sqrtf(mean + eps) in float32;
- RoPE: angles from repeated float32 multiplication theta *= theta_scale (ggml's rope cache), libm
  cosf/sinf/powf/logf (numba calls the same C library), pairs (i, i + n/2) for NeoX, (2i, 2i+1) otherwise;
  YaRN as ggml's rope_yarn, with the fused multiply-adds GCC makes of it;
- SwiGLU: ggml_v_silu on 8-value chunks, libm expf on the leftovers; gpt-oss's clamped variant (swiglu_oai)
  in scalar float32 with libm expf;
- softmax: ggml_vec_soft_max_f32 (ggml_v_expf on blocks of 8, libm expf on the rest, float64 sum);
- SiLU (ggml_vec_silu_f32) as SwiGLU's; sigmoid: 1 / (1 + expf(-x)) with libm expf (ggml's unary op);
- situ (kimi-k3): ggml_scale, libm tanhf and sigmoid, ggml_mul, each rounded to float32;
- M-RoPE on text: each pair's angle comes from one of four position ids; text tokens have the first three
  equal to the position and the fourth 0.
"""

import numpy as np
from numba import njit

from ggtools.runtime.kernels.ggmlmath import EXACT, fma, silu
from ggtools.runtime.kernels.simd import exp_blocks8, silu_8, swiglu_8

F32 = np.float32
NO_YARN = (F32(0.0), F32(1.0), np.zeros(2, np.float32))   # rope_angles' ext_factor, attn_factor, corr_dims


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
def all_finite(x) -> bool:
    """Whether every value of x (float32) is finite: np.isfinite(x).all() without its temporary array and calls (a
    one-token step's logits check: 9.7 us of a tiny target's step with numpy, whose interpreter state the weights
    evict). On the bits, in integer operations LLVM vectorizes: an exponent of all ones (inf, NaN) plus one carries
    into bit 31."""
    bits = np.ascontiguousarray(x).reshape(-1).view(np.uint32)
    carries = np.uint32(0)
    for i in range(bits.size):     # indexed: numba's iterator over the view ran 2x slower
        carries |= (bits[i] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
    return carries < np.uint32(0x80000000)


@njit(**EXACT)
def rope_angles(positions, n_dims, base, freq_scale, freq_factors, ext_factor, attn_factor, corr_dims):
    """cos, sin (len(positions), n_dims // 2) as ggml_rope_cache_init computes them: rope_yarn per pair,
    which for ext_factor 0 and attn_factor 1 is plain (linearly scaled) RoPE."""
    theta_scale = np.power(np.float32(base), np.float32(-2.0) / np.float32(n_dims))
    mscale = attn_factor
    if ext_factor != F32(0.0):
        mscale = mscale * fma(F32(0.1), np.log(F32(1.0) / freq_scale), F32(1.0))
    cos = np.empty((positions.size, n_dims // 2), np.float32)
    sin = np.empty((positions.size, n_dims // 2), np.float32)
    for t in range(positions.size):
        theta = np.float32(positions[t])
        for i in range(n_dims // 2):
            ff = freq_factors[i] if freq_factors.size else np.float32(1.0)
            extrap = theta / ff
            angle = freq_scale * extrap
            if ext_factor != F32(0.0):
                y = (F32(i) - corr_dims[0]) / max(F32(0.001), corr_dims[1] - corr_dims[0])
                mix = (F32(1.0) - min(F32(1.0), max(F32(0.0), y))) * ext_factor
                angle = fma(angle, F32(1.0) - mix, extrap * mix)
            cos[t, i] = np.cos(angle) * mscale
            sin[t, i] = np.sin(angle) * mscale
            theta = theta * theta_scale
    return cos, sin


@njit(**EXACT)
def yarn_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    """ggml_rope_yarn_corr_dims: the first and last dims where YaRN ramps from extrapolation to interpolation."""
    two_pi = F32(2.0) * F32(np.pi)
    start = np.floor(F32(n_dims) * np.log(F32(n_ctx_orig) / (beta_fast * two_pi)) / (F32(2.0) * np.log(base)))
    end = np.ceil(F32(n_dims) * np.log(F32(n_ctx_orig) / (beta_slow * two_pi)) / (F32(2.0) * np.log(base)))
    return np.array([max(F32(0.0), start), min(F32(n_dims - 1), end)], np.float32)


@njit(**EXACT)
def yarn_attn_factor(freq_scale):
    """llama_context's yarn_attn_factor: get_mscale(factor) times 1 / (1 + 0.1 ln factor), which cancels it up to
    rounding (rope_yarn multiplies by that factor again)."""
    m = fma(F32(0.1), np.log(F32(1.0) / freq_scale), F32(1.0))
    return m * (F32(1.0) / m)


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
    """ggml_vec_swiglu_f32 on each row: ggml_v_silu(gate) * up on 8-value chunks (a vector kernel where the rows are
    unit-stride), libm expf on the leftovers."""
    n = gate.shape[1]
    n_main = n // 8 * 8
    vector = gate.strides[1] == 4 and up.strides[1] == 4 and out.strides[1] == 4
    for r in range(gate.shape[0]):
        if vector:
            swiglu_8(gate[r], up[r], out[r], n_main // 8)
        else:
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
def swiglu_oai_rows(gate, up, alpha, limit, out):
    """ggml_swiglu_oai: x = min(gate, limit), y = clamp(up, -limit, limit), x / (1 + exp(alpha * -x)) * (y + 1)."""
    for r in range(gate.shape[0]):
        for i in range(gate.shape[1]):
            x = min(gate[r, i], limit)
            y = min(max(up[r, i], -limit), limit)
            out[r, i] = x / (F32(1.0) + np.exp(alpha * (F32(0.0) - x))) * (y + F32(1.0))


@njit(**EXACT)
def soft_max(x, out, sink):
    """out = softmax(x) as ggml_soft_max computes a row (scale 1, no mask): ggml_vec_soft_max_f32, then the
    scale by 1 / sum. sink: soft_max_add_sinks' extra logit, in the max and the sum only (-inf: none)."""
    m = sink
    for s in range(x.size):
        m = max(m, x[s])
    n8 = x.size // 8 * 8
    total = exp_blocks8(x[:n8], F32(m), out[:n8])
    for s in range(n8, x.size):
        e = np.exp(x[s] - m)
        out[s] = e
        total += np.float64(e)
    if sink != -np.inf:
        total += np.float64(np.exp(sink - m))
    inv = F32(1.0 / total)
    for s in range(x.size):
        out[s] = out[s] * inv


@njit(**EXACT)
def silu_rows(x, out):
    """ggml_vec_silu_f32 on each row of x (T, n): ggml_v_silu on 8-value chunks, libm expf on the leftovers."""
    n = x.shape[1]
    n_main = n // 8 * 8
    vector = x.strides[1] == 4 and out.strides[1] == 4
    for r in range(x.shape[0]):
        if vector:
            silu_8(x[r], out[r], n_main // 8)
        else:
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
    """Which of the n_pairs rotated pairs ggml_mrope_cache_init gives the fourth position id: interleaved
    (IMROPE, qwen35) assigns pair i by (i % sum) % 3 within 3 * section bounds; otherwise (MROPE) the
    sections follow each other."""
    s0, s1, s2, s3 = sections
    sector = np.arange(n_pairs) % (s0 + s1 + s2 + s3)
    if interleaved:
        return ~(((sector % 3 == 0) & (sector < 3 * s0)) | ((sector % 3 == 1) & (sector < 3 * s1)) |
                 ((sector % 3 == 2) & (sector < 3 * s2)))
    return sector >= s0 + s1 + s2


def text_rope_angles(rope: tuple, rope_at_0: tuple, still: np.ndarray) -> tuple:
    """M-RoPE cos/sin tables of text tokens: plain RoPE's (rope_angles) at the tokens' positions, except for
    the pairs of the fourth section (`still`, fourth_section_pairs), which take the angles of position 0
    (rope_at_0, one row)."""
    cos, sin = rope[0].copy(), rope[1].copy()
    cos[:, still], sin[:, still] = rope_at_0[0][0, still], rope_at_0[1][0, still]
    return cos, sin


@njit(**EXACT)
def situ_rows(gate, up, beta, linear_beta, out):
    """kimi-k3's situ as llama.cpp's graph computes it (kimi_k3_situ, build_moe_ffn's LLM_FFN_SITU), op by op:
    beta * tanh(gate * (1 / beta)) * sigmoid(gate), times linear_beta * tanh(up * (1 / linear_beta)) (up as is
    when linear_beta <= 0). beta, linear_beta: float32."""
    inv_beta = F32(1.0) / beta
    inv_linear = F32(1.0) / linear_beta if linear_beta > F32(0.0) else F32(0.0)
    for r in range(gate.shape[0]):
        for i in range(gate.shape[1]):
            g, u = gate[r, i], up[r, i]
            a = (np.tanh(g * inv_beta) * beta) * sigmoid(g)
            if linear_beta > F32(0.0):
                u = np.tanh(u * inv_linear) * linear_beta
            out[r, i] = a * u
