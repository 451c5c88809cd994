"""32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (quantize and decode) and MXFP4 (decode).

Per-block functions take (x, x_offset, y, y_offset): a flat float32 array and a flat uint8 array,
so a runtime can call them on any block of a tensor. They follow ggml's quantize_row_*_ref and
dequantize_row_* statement by statement; see ../shared/reference/quant-recipes.md §3.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit, prange

from .floatbits import JIT, f32_from_bits, fp16_at, store_fp16

QK, Q4_0_BYTES = GGML_QUANT_SIZES[T.Q4_0]
Q4_1_BYTES = GGML_QUANT_SIZES[T.Q4_1][1]
Q5_0_BYTES = GGML_QUANT_SIZES[T.Q5_0][1]
Q5_1_BYTES = GGML_QUANT_SIZES[T.Q5_1][1]
Q8_0_BYTES = GGML_QUANT_SIZES[T.Q8_0][1]
MXFP4_BYTES = GGML_QUANT_SIZES[T.MXFP4][1]
HALF = QK // 2

FLT_MAX = np.float32(np.finfo(np.float32).max)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


@njit(**JIT)
def c_to_int(f):
    """C's float -> int conversion (truncation; x86 gives INT_MIN for NaN and out of range)."""
    return np.int64(np.int32(f))


@njit(**JIT)
def roundf(f):
    """C roundf: half away from zero, exact in float32."""
    a = abs(f)
    fl = np.floor(a)
    r = fl + np.floor(np.float32(2.0) * (a - fl))
    return r if f >= np.float32(0.0) else -r


@njit(**JIT)
def signed_absmax(x, xo, n):
    """(amax, max): the largest |x| and its signed value; strict '<' so the first one wins and
    NaNs are skipped, as in ggml."""
    amax = np.float32(0.0)
    vmax = np.float32(0.0)
    for j in range(n):
        v = x[xo + j]
        if amax < abs(v):
            amax = abs(v)
            vmax = v
    return amax, vmax


@njit(**JIT)
def min_max(x, xo, n):
    """min and max from +-FLT_MAX with strict compares (NaNs skipped)."""
    vmin = FLT_MAX
    vmax = -FLT_MAX
    for j in range(n):
        v = x[xo + j]
        if v < vmin:
            vmin = v
        if v > vmax:
            vmax = v
    return vmin, vmax


@njit(**JIT)
def inverse(d):
    return np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)


@njit(**JIT)
def quantize_block_q4_0(x, xo, y, yo):
    amax, vmax = signed_absmax(x, xo, QK)
    d = vmax / np.float32(-8.0)
    idd = inverse(d)
    store_fp16(y, yo, d)
    for j in range(HALF):
        q0 = min(15, c_to_int(x[xo + j] * idd + np.float32(8.5)) & 0xFF)
        q1 = min(15, c_to_int(x[xo + HALF + j] * idd + np.float32(8.5)) & 0xFF)
        y[yo + 2 + j] = q0 | (q1 << 4)


@njit(**JIT)
def quantize_block_q4_1(x, xo, y, yo):
    vmin, vmax = min_max(x, xo, QK)
    d = (vmax - vmin) / np.float32(15.0)
    idd = inverse(d)
    store_fp16(y, yo, d)
    store_fp16(y, yo + 2, vmin)
    for j in range(HALF):
        q0 = min(15, c_to_int((x[xo + j] - vmin) * idd + np.float32(0.5)) & 0xFF)
        q1 = min(15, c_to_int((x[xo + HALF + j] - vmin) * idd + np.float32(0.5)) & 0xFF)
        y[yo + 4 + j] = q0 | (q1 << 4)


@njit(**JIT)
def store_q5(y, yo, q0, q1, j, qh):
    """Pack element j and j+16 of a 5-bit block; returns the updated high-bit word."""
    y[yo + j] = (q0 & 15) | ((q1 & 15) << 4)
    return qh | (((q0 & 16) >> 4) << j) | (((q1 & 16) >> 4) << (j + HALF))


@njit(**JIT)
def store_u32(y, yo, v):
    for k in range(4):
        y[yo + k] = (v >> (8 * k)) & 0xFF


@njit(**JIT)
def quantize_block_q5_0(x, xo, y, yo):
    amax, vmax = signed_absmax(x, xo, QK)
    d = vmax / np.float32(-16.0)
    idd = inverse(d)
    store_fp16(y, yo, d)
    qh = 0
    for j in range(HALF):
        q0 = min(31, c_to_int(x[xo + j] * idd + np.float32(16.5)) & 0xFF)
        q1 = min(31, c_to_int(x[xo + HALF + j] * idd + np.float32(16.5)) & 0xFF)
        qh = store_q5(y, yo + 6, q0, q1, j, qh)
    store_u32(y, yo + 2, qh)


@njit(**JIT)
def quantize_block_q5_1(x, xo, y, yo):
    vmin, vmax = min_max(x, xo, QK)
    d = (vmax - vmin) / np.float32(31.0)
    idd = inverse(d)
    store_fp16(y, yo, d)
    store_fp16(y, yo + 2, vmin)
    qh = 0
    for j in range(HALF):
        q0 = c_to_int((x[xo + j] - vmin) * idd + np.float32(0.5)) & 0xFF
        q1 = c_to_int((x[xo + HALF + j] - vmin) * idd + np.float32(0.5)) & 0xFF
        qh = store_q5(y, yo + 8, q0, q1, j, qh)
    store_u32(y, yo + 4, qh)


@njit(**JIT)
def quantize_block_q8_0(x, xo, y, yo):
    amax = np.float32(0.0)
    for j in range(QK):
        v = abs(x[xo + j])
        amax = amax if amax > v else v  # C's MAX(amax, fabsf(v)), NaN included
    d = amax / np.float32(127.0)
    idd = inverse(d)
    store_fp16(y, yo, d)
    for j in range(QK):
        y[yo + 2 + j] = c_to_int(roundf(x[xo + j] * idd)) & 0xFF


@njit(**JIT)
def decode_block_q4_0(src, so, out, oo):
    d = fp16_at(src, so)
    for j in range(HALF):
        b = np.int64(src[so + 2 + j])
        out[oo + j] = np.float32((b & 15) - 8) * d
        out[oo + HALF + j] = np.float32((b >> 4) - 8) * d


@njit(**JIT)
def decode_block_q4_1(src, so, out, oo):
    d = fp16_at(src, so)
    m = fp16_at(src, so + 2)
    for j in range(HALF):
        b = np.int64(src[so + 4 + j])
        out[oo + j] = np.float32(b & 15) * d + m
        out[oo + HALF + j] = np.float32(b >> 4) * d + m


@njit(**JIT)
def load_u32(src, so):
    v = np.int64(0)
    for k in range(4):
        v |= np.int64(src[so + k]) << (8 * k)
    return v


@njit(**JIT)
def decode_block_q5_0(src, so, out, oo):
    d = fp16_at(src, so)
    qh = load_u32(src, so + 2)
    for j in range(HALF):
        b = np.int64(src[so + 6 + j])
        q0 = (b & 15) | (((qh >> j) << 4) & 16)
        q1 = (b >> 4) | ((qh >> (j + 12)) & 16)
        out[oo + j] = np.float32(q0 - 16) * d
        out[oo + HALF + j] = np.float32(q1 - 16) * d


@njit(**JIT)
def decode_block_q5_1(src, so, out, oo):
    d = fp16_at(src, so)
    m = fp16_at(src, so + 2)
    qh = load_u32(src, so + 4)
    for j in range(HALF):
        b = np.int64(src[so + 8 + j])
        q0 = (b & 15) | (((qh >> j) << 4) & 16)
        q1 = (b >> 4) | ((qh >> (j + 12)) & 16)
        out[oo + j] = np.float32(q0) * d + m
        out[oo + HALF + j] = np.float32(q1) * d + m


@njit(**JIT)
def decode_block_q8_0(src, so, out, oo):
    d = fp16_at(src, so)
    for j in range(QK):
        q = np.int64(src[so + 2 + j])
        out[oo + j] = np.float32(q - ((q & 128) << 1)) * d


@njit(**JIT)
def e8m0_half(e):
    """ggml_e8m0_to_fp32_half: 2**(e - 128) as float32, denormal for e < 2."""
    bits = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
    return f32_from_bits(np.int64(bits))


@njit(**JIT)
def decode_block_mxfp4(src, so, out, oo):
    d = e8m0_half(np.int64(src[so]))
    for j in range(HALF):
        b = np.int64(src[so + 1 + j])
        out[oo + j] = KVALUES_MXFP4[b & 15] * d
        out[oo + HALF + j] = KVALUES_MXFP4[b >> 4] * d


# Parallel row kernels over flat arrays: rows are contiguous, so block b of the whole chunk
# reads x[b*QK:] and writes y[b*bytes:], whatever the row length.

@njit(parallel=True, **JIT)
def quantize_q4_0(x, y):
    for b in prange(x.size // QK):
        quantize_block_q4_0(x, b * QK, y, b * Q4_0_BYTES)


@njit(parallel=True, **JIT)
def quantize_q4_1(x, y):
    for b in prange(x.size // QK):
        quantize_block_q4_1(x, b * QK, y, b * Q4_1_BYTES)


@njit(parallel=True, **JIT)
def quantize_q5_0(x, y):
    for b in prange(x.size // QK):
        quantize_block_q5_0(x, b * QK, y, b * Q5_0_BYTES)


@njit(parallel=True, **JIT)
def quantize_q5_1(x, y):
    for b in prange(x.size // QK):
        quantize_block_q5_1(x, b * QK, y, b * Q5_1_BYTES)


@njit(parallel=True, **JIT)
def quantize_q8_0(x, y):
    for b in prange(x.size // QK):
        quantize_block_q8_0(x, b * QK, y, b * Q8_0_BYTES)


@njit(parallel=True, **JIT)
def dequantize_q4_0(src, out):
    for b in prange(out.size // QK):
        decode_block_q4_0(src, b * Q4_0_BYTES, out, b * QK)


@njit(parallel=True, **JIT)
def dequantize_q4_1(src, out):
    for b in prange(out.size // QK):
        decode_block_q4_1(src, b * Q4_1_BYTES, out, b * QK)


@njit(parallel=True, **JIT)
def dequantize_q5_0(src, out):
    for b in prange(out.size // QK):
        decode_block_q5_0(src, b * Q5_0_BYTES, out, b * QK)


@njit(parallel=True, **JIT)
def dequantize_q5_1(src, out):
    for b in prange(out.size // QK):
        decode_block_q5_1(src, b * Q5_1_BYTES, out, b * QK)


@njit(parallel=True, **JIT)
def dequantize_q8_0(src, out):
    for b in prange(out.size // QK):
        decode_block_q8_0(src, b * Q8_0_BYTES, out, b * QK)


@njit(parallel=True, **JIT)
def dequantize_mxfp4(src, out):
    for b in prange(out.size // QK):
        decode_block_mxfp4(src, b * MXFP4_BYTES, out, b * QK)
