"""K-quant decoders (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

decode_block_<type>(src, src_offset, out, out_offset) port ggml's dequantize_row_* for one block
(float32 arithmetic in the C order); they need no scratch, so a runtime can call them block by
block. dequantize_<type>(src, out) run them in parallel over flat arrays.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit, prange

from .floatbits import JIT, fp16_at

QK_K, Q2_K_BYTES = GGML_QUANT_SIZES[T.Q2_K]
Q3_K_BYTES = GGML_QUANT_SIZES[T.Q3_K][1]
Q4_K_BYTES = GGML_QUANT_SIZES[T.Q4_K][1]
Q5_K_BYTES = GGML_QUANT_SIZES[T.Q5_K][1]
Q6_K_BYTES = GGML_QUANT_SIZES[T.Q6_K][1]


@njit(**JIT)
def get_scale_min_k4(j, q, so):
    if j < 4:
        return np.int64(q[so + j]) & 63, np.int64(q[so + j + 4]) & 63
    sc = (np.int64(q[so + j + 4]) & 15) | ((np.int64(q[so + j - 4]) >> 6) << 4)
    m = (np.int64(q[so + j + 4]) >> 4) | ((np.int64(q[so + j]) >> 6) << 4)
    return sc, m


@njit(**JIT)
def q3_scale(src, so, j):
    """6-bit scale j of a Q3_K block (still offset by +32)."""
    low = (np.int64(src[so + j]) & 15) if j < 8 else (np.int64(src[so + j - 8]) >> 4)
    high = (np.int64(src[so + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return low | (high << 4)


@njit(**JIT)
def decode_block_q2_k(src, so, out, oo):
    d = fp16_at(src, so + 80)
    dmin = fp16_at(src, so + 82)
    for e in range(QK_K):
        sc = np.int64(src[so + e // 16])
        h, r = e // 128, e % 128
        q = (np.int64(src[so + 16 + 32 * h + r % 32]) >> (2 * (r // 32))) & 3
        dl = d * np.float32(sc & 15)
        ml = dmin * np.float32(sc >> 4)
        out[oo + e] = dl * np.float32(q) - ml


@njit(**JIT)
def decode_block_q3_k(src, so, out, oo):
    d = fp16_at(src, so + 108)
    for e in range(QK_K):
        dl = d * np.float32(q3_scale(src, so + 96, e // 16) - 32)
        h, r = e // 128, e % 128
        q = (np.int64(src[so + 32 + 32 * h + r % 32]) >> (2 * (r // 32))) & 3
        hbit = (np.int64(src[so + e % 32]) >> (e // 32)) & 1
        out[oo + e] = dl * np.float32(q - (0 if hbit else 4))


@njit(**JIT)
def decode_block_q4_k(src, so, out, oo):
    d = fp16_at(src, so)
    dmin = fp16_at(src, so + 2)
    for c in range(4):
        sc, m = get_scale_min_k4(2 * c, src, so + 4)
        d1 = d * np.float32(sc)
        m1 = dmin * np.float32(m)
        sc, m = get_scale_min_k4(2 * c + 1, src, so + 4)
        d2 = d * np.float32(sc)
        m2 = dmin * np.float32(m)
        for l in range(32):
            q = np.int64(src[so + 16 + 32 * c + l])
            out[oo + 64 * c + l] = d1 * np.float32(q & 15) - m1
            out[oo + 64 * c + 32 + l] = d2 * np.float32(q >> 4) - m2


@njit(**JIT)
def decode_block_q5_k(src, so, out, oo):
    d = fp16_at(src, so)
    dmin = fp16_at(src, so + 2)
    for c in range(4):
        sc, m = get_scale_min_k4(2 * c, src, so + 4)
        d1 = d * np.float32(sc)
        m1 = dmin * np.float32(m)
        sc, m = get_scale_min_k4(2 * c + 1, src, so + 4)
        d2 = d * np.float32(sc)
        m2 = dmin * np.float32(m)
        for l in range(32):
            q = np.int64(src[so + 48 + 32 * c + l])
            h = np.int64(src[so + 16 + l]) >> (2 * c)
            out[oo + 64 * c + l] = d1 * np.float32((q & 15) + 16 * (h & 1)) - m1
            out[oo + 64 * c + 32 + l] = d2 * np.float32((q >> 4) + 16 * ((h >> 1) & 1)) - m2


@njit(**JIT)
def decode_block_q6_k(src, so, out, oo):
    d = fp16_at(src, so + 208)
    for h in range(2):
        ql = so + 64 * h
        qh = so + 128 + 32 * h
        for l in range(32):
            hb = np.int64(src[qh + l])
            lo = np.int64(src[ql + l])
            hi = np.int64(src[ql + l + 32])
            qs = ((lo & 15) | ((hb & 3) << 4), (hi & 15) | (((hb >> 2) & 3) << 4),
                  (lo >> 4) | (((hb >> 4) & 3) << 4), (hi >> 4) | (((hb >> 6) & 3) << 4))
            for k in range(4):
                e = 128 * h + l + 32 * k
                sc = np.int64(src[so + 192 + e // 16])
                dl = d * np.float32(sc - ((sc & 128) << 1))
                out[oo + e] = dl * np.float32(qs[k] - 32)


@njit(parallel=True, **JIT)
def dequantize_q2_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q2_k(src, b * Q2_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q3_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q3_k(src, b * Q3_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q4_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q4_k(src, b * Q4_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q5_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q5_k(src, b * Q5_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q6_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q6_k(src, b * Q6_K_BYTES, out, b * QK_K)
