"""32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (quantize and decode) and MXFP4 (decode).

Per-block functions take (x, x_offset, y, y_offset): a flat float32 array and a flat uint8 array,
so a runtime can call them on any block of a tensor. They follow ggml's quantize_row_*_ref and
dequantize_row_* statement by statement (quant-recipes.md §3). Element loops work on block views
in 32-bit integers so LLVM vectorizes them (numba widens integer arithmetic to 64 bits, which
AVX2 cannot vectorize, hence the np.int32 casts). Q4_0, Q4_1, Q5_0 and Q5_1 take each block's
scale fields from a first pass over a group of blocks (block_scales), then encode.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit, prange

from .floatbits import JIT, f32_bits, f32_from_bits, fp16_at, fp32_to_fp16, store_fp16

QK, Q4_0_BYTES = GGML_QUANT_SIZES[T.Q4_0]
Q4_1_BYTES = GGML_QUANT_SIZES[T.Q4_1][1]
Q5_0_BYTES = GGML_QUANT_SIZES[T.Q5_0][1]
Q5_1_BYTES = GGML_QUANT_SIZES[T.Q5_1][1]
Q8_0_BYTES = GGML_QUANT_SIZES[T.Q8_0][1]
MXFP4_BYTES = GGML_QUANT_SIZES[T.MXFP4][1]
HALF = QK // 2

F0 = np.float32(0.0)
FLT_MAX = np.float32(np.finfo(np.float32).max)
TWO31 = np.float32(2.0**31)
INT_MIN = np.int32(-(2**31))
BYTE, SIGN8, FIFTEEN, FOUR = np.int32(0xFF), np.int32(0x80), np.int32(15), np.int32(4)
I32_MAX, I32_MIN = np.int32(2**31 - 1), np.int32(-(2**31))
LOW31, INF_BITS, SHIFT31 = np.int32(0x7FFFFFFF), np.int32(0x7F800000), np.int32(31)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


# ---------------------------------------------------------------- C semantics helpers

@njit(**JIT)
def c_int(f):
    """C's float -> int conversion on x86-64 (cvttss2si): truncation; NaN and out-of-range
    values give INT_MIN. Spelled out because LLVM leaves those cases undefined."""
    return np.int32(f) if abs(f) < TWO31 else INT_MIN


@njit(**JIT)
def c_int8(f):
    """(int8_t)f: the low byte of c_int(f), signed."""
    return np.int32(np.int32(np.int32(c_int(f) & BYTE) ^ SIGN8) - SIGN8)


@njit(**JIT)
def roundf(f):
    """C roundf: half away from zero, exact in float32."""
    a = abs(f)
    fl = np.floor(a)
    r = fl + np.floor(np.float32(2.0) * (a - fl))
    return r if f >= F0 else -r


@njit(**JIT)
def signed_absmax(xb):
    """(amax, max): the largest |x| and its signed value, the first one winning and NaNs skipped,
    as ggml's chain of strict '<' compares finds them. Here one integer max over keys (a value's
    magnitude bits, then 31 - its index: the first of equal magnitudes has the largest key),
    which vectorizes; |x| orders as its bits do."""
    key = np.int64(0)
    for j in range(xb.shape[0]):  # not range(QK): a known count gets unrolled, not vectorized
        a = np.int32(np.int32(f32_bits(xb[j])) & LOW31)
        k = (np.int64(a) << np.int64(5)) | np.int64(QK - 1 - j)
        key = max(key, k if a <= INF_BITS else np.int64(0))   # NaN: never bigger
    if key < QK:          # every magnitude 0: max stays 0.0
        return F0, F0
    v = xb[QK - 1 - (key & (QK - 1))]
    return abs(v), v


@njit(**JIT)
def min_max_in_order(xb):
    """min and max from +-FLT_MAX with strict compares (NaNs skipped, the first of equal values wins)."""
    vmin = FLT_MAX
    vmax = -FLT_MAX
    for j in range(QK):
        v = xb[j]
        if v < vmin:
            vmin = v
        if v > vmax:
            vmax = v
    return vmin, vmax



@njit(**JIT)
def order_key(bits):
    """An int32 whose order is the float order of these float32 bits (-0 just below +0); its own
    inverse, so it also turns a key back into bits."""
    return np.int32(bits ^ ((bits >> SHIFT31) & LOW31))


KEY_FLT_MAX, KEY_NEG_FLT_MAX, KEY_ZERO, KEY_NEG_ZERO = (
    order_key.py_func(b) for b in np.array([FLT_MAX, -FLT_MAX, 0.0, -0.0], np.float32).view(np.int32))


@njit(**JIT)
def min_max(xb):
    """min_max_in_order as an integer min/max over order keys, which has no serial float compare chain.
    Equal floats have equal bits except +0 and -0, where the first one wins: a zero result is
    recomputed in order."""
    kmin, kmax = KEY_FLT_MAX, KEY_NEG_FLT_MAX
    for j in range(QK):
        b = np.int32(f32_bits(xb[j]))
        nan = np.int32(b & LOW31) > INF_BITS
        key = order_key(b)
        kmin = min(kmin, I32_MAX if nan else key)
        kmax = max(kmax, I32_MIN if nan else key)
    if kmin == KEY_ZERO or kmin == KEY_NEG_ZERO or kmax == KEY_ZERO or kmax == KEY_NEG_ZERO:
        return min_max_in_order(xb)
    return f32_from_bits(order_key(kmin)), f32_from_bits(order_key(kmax))


@njit(**JIT)
def inverse(d):
    return np.float32(1.0) / d if d != F0 else F0


@njit(**JIT)
def store_u32(yb, v):
    for k in range(4):
        yb[k] = (v >> (8 * k)) & 0xFF


@njit(**JIT)
def load_u32(src):
    return (np.uint32(src[0]) | (np.uint32(src[1]) << np.uint32(8))
            | (np.uint32(src[2]) << np.uint32(16)) | (np.uint32(src[3]) << np.uint32(24)))


# ---------------------------------------------------------------- quantize
# A block's scale fields (d, and the min m for Q4_1/Q5_1) are computed first, for a group of blocks
# at once (block_scales: vector loops over the blocks, fp16 rounding included), then each block is
# encoded with them. quantize_block_* do both for one block.

@njit(**JIT)
def store_half(yb, offset, h):
    """Store the fp16 bits h little-endian at yb[offset]."""
    yb[offset] = h & 0xFF
    yb[offset + 1] = (h >> 8) & 0xFF


@njit(**JIT)
def quantize_block_q4_0(x, xo, y, yo):
    d = signed_absmax(x[xo:xo + QK])[1] / np.float32(-8.0)
    encode_block_q4_0(x, xo, y, yo, inverse(d), fp32_to_fp16(d))


@njit(**JIT)
def encode_block_q4_0(x, xo, y, yo, idd, d_bits):
    """quantize_row_q4_0_ref for one block whose d (as 1/d and fp16 bits) is known."""
    xb, yb = x[xo:xo + QK], y[yo:yo + Q4_0_BYTES]
    store_half(yb, 0, d_bits)
    for j in range(HALF):
        q0 = min(np.int32(15), c_int8(xb[j] * idd + np.float32(8.5)))
        q1 = min(np.int32(15), c_int8(xb[HALF + j] * idd + np.float32(8.5)))
        yb[2 + j] = np.uint8((q0 & 0xFF) | ((q1 << 4) & 0xFF))


@njit(**JIT)
def quantize_block_q4_1(x, xo, y, yo):
    vmin, vmax = min_max(x[xo:xo + QK])
    d = (vmax - vmin) / np.float32(15.0)
    encode_block_q4_1(x, xo, y, yo, vmin, inverse(d), fp32_to_fp16(d), fp32_to_fp16(vmin))


@njit(**JIT)
def encode_block_q4_1(x, xo, y, yo, vmin, idd, d_bits, m_bits):
    """quantize_row_q4_1_ref for one block whose min (and its fp16 bits) and d (1/d, fp16 bits) are known."""
    xb, yb = x[xo:xo + QK], y[yo:yo + Q4_1_BYTES]
    store_half(yb, 0, d_bits)
    store_half(yb, 2, m_bits)
    for j in range(HALF):  # int32 throughout, so the loop vectorizes
        q0 = min(FIFTEEN, c_int8((xb[j] - vmin) * idd + np.float32(0.5)))
        q1 = min(FIFTEEN, c_int8((xb[HALF + j] - vmin) * idd + np.float32(0.5)))
        yb[4 + j] = np.uint8(np.int32(q0 & BYTE) | np.int32(np.int32(q1 << FOUR) & BYTE))


@njit(**JIT)
def q5_high_bit(q, j):
    """Bit 4 of the 5-bit level q, moved to bit j of the little-endian qh word."""
    return (np.uint32(q >> 4) & np.uint32(1)) << np.uint32(j)


@njit(**JIT)
def quantize_block_q5_0(x, xo, y, yo):
    d = signed_absmax(x[xo:xo + QK])[1] / np.float32(-16.0)
    encode_block_q5_0(x, xo, y, yo, inverse(d), fp32_to_fp16(d))


@njit(**JIT)
def encode_block_q5_0(x, xo, y, yo, idd, d_bits):
    """quantize_row_q5_0_ref for one block whose d (as 1/d and fp16 bits) is known."""
    xb, yb = x[xo:xo + QK], y[yo:yo + Q5_0_BYTES]
    store_half(yb, 0, d_bits)
    qh = np.uint32(0)
    for j in range(HALF):
        q0 = min(np.int32(31), c_int8(xb[j] * idd + np.float32(16.5))) & 0xFF
        q1 = min(np.int32(31), c_int8(xb[HALF + j] * idd + np.float32(16.5))) & 0xFF
        yb[6 + j] = np.uint8((q0 & 15) | ((q1 & 15) << 4))
        qh |= q5_high_bit(q0, j) | q5_high_bit(q1, j + HALF)
    store_u32(yb[2:6], qh)


@njit(**JIT)
def quantize_block_q5_1(x, xo, y, yo):
    vmin, vmax = min_max(x[xo:xo + QK])
    d = (vmax - vmin) / np.float32(31.0)
    encode_block_q5_1(x, xo, y, yo, vmin, inverse(d), fp32_to_fp16(d), fp32_to_fp16(vmin))


@njit(**JIT)
def encode_block_q5_1(x, xo, y, yo, vmin, idd, d_bits, m_bits):
    """quantize_row_q5_1_ref for one block whose min (and its fp16 bits) and d (1/d, fp16 bits) are known."""
    xb, yb = x[xo:xo + QK], y[yo:yo + Q5_1_BYTES]
    store_half(yb, 0, d_bits)
    store_half(yb, 2, m_bits)
    qh = np.uint32(0)
    for j in range(HALF):
        q0 = c_int((xb[j] - vmin) * idd + np.float32(0.5)) & 0xFF  # (uint8_t), no clamp
        q1 = c_int((xb[HALF + j] - vmin) * idd + np.float32(0.5)) & 0xFF
        yb[8 + j] = np.uint8((q0 & 15) | ((q1 & 15) << 4))
        qh |= q5_high_bit(q0, j) | q5_high_bit(q1, j + HALF)
    store_u32(yb[4:8], qh)


@njit(**JIT)
def quantize_block_q8_0(x, xo, y, yo):
    xb, yb = x[xo:xo + QK], y[yo:yo + Q8_0_BYTES]
    amax = F0
    for j in range(QK):
        v = abs(xb[j])
        amax = amax if amax > v else v  # C's MAX(amax, fabsf(v)), NaN included
    d = amax / np.float32(127.0)
    idd = inverse(d)
    store_fp16(yb, 0, d)
    for j in range(QK):
        yb[2 + j] = np.uint8(c_int(roundf(xb[j] * idd)) & 0xFF)


# ---------------------------------------------------------------- decode

@njit(**JIT)
def decode_block_q4_0(src, so, out, oo):
    sb, ob = src[so:so + Q4_0_BYTES], out[oo:oo + QK]
    d = fp16_at(sb, 0)
    for j in range(HALF):
        b = np.int32(sb[2 + j])
        ob[j] = np.float32((b & 15) - 8) * d
        ob[HALF + j] = np.float32((b >> 4) - 8) * d


@njit(**JIT)
def decode_block_q4_1(src, so, out, oo):
    sb, ob = src[so:so + Q4_1_BYTES], out[oo:oo + QK]
    d = fp16_at(sb, 0)
    m = fp16_at(sb, 2)
    for j in range(HALF):
        b = np.int32(sb[4 + j])
        ob[j] = np.float32(b & 15) * d + m
        ob[HALF + j] = np.float32(b >> 4) * d + m


@njit(**JIT)
def decode_block_q5_0(src, so, out, oo):
    sb, ob = src[so:so + Q5_0_BYTES], out[oo:oo + QK]
    d = fp16_at(sb, 0)
    qh = load_u32(sb[2:6])
    for j in range(HALF):
        b = np.int32(sb[6 + j])
        q0 = (b & 15) | np.int32((qh >> np.uint32(j)) << np.uint32(4) & np.uint32(16))
        q1 = (b >> 4) | np.int32((qh >> np.uint32(j + 12)) & np.uint32(16))
        ob[j] = np.float32(q0 - 16) * d
        ob[HALF + j] = np.float32(q1 - 16) * d


@njit(**JIT)
def decode_block_q5_1(src, so, out, oo):
    sb, ob = src[so:so + Q5_1_BYTES], out[oo:oo + QK]
    d = fp16_at(sb, 0)
    m = fp16_at(sb, 2)
    qh = load_u32(sb[4:8])
    for j in range(HALF):
        b = np.int32(sb[8 + j])
        q0 = (b & 15) | np.int32((qh >> np.uint32(j)) << np.uint32(4) & np.uint32(16))
        q1 = (b >> 4) | np.int32((qh >> np.uint32(j + 12)) & np.uint32(16))
        ob[j] = np.float32(q0) * d + m
        ob[HALF + j] = np.float32(q1) * d + m


@njit(**JIT)
def decode_block_q8_0(src, so, out, oo):
    sb, ob = src[so:so + Q8_0_BYTES], out[oo:oo + QK]
    d = fp16_at(sb, 0)
    qs = sb[2:].view(np.int8)
    for j in range(ob.shape[0]):  # not range(QK): a known count gets unrolled, not vectorized
        ob[j] = np.float32(qs[j]) * d


@njit(**JIT)
def e8m0_half(e):
    """ggml_e8m0_to_fp32_half: 2**(e - 128) as float32, denormal for e < 2."""
    bits = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
    return f32_from_bits(np.int64(bits))


@njit(**JIT)
def decode_block_mxfp4(src, so, out, oo):
    sb, ob = src[so:so + MXFP4_BYTES], out[oo:oo + QK]
    d = e8m0_half(np.int64(sb[0]))
    for j in range(HALF):
        b = np.int32(sb[1 + j])
        ob[j] = KVALUES_MXFP4[b & 15] * d
        ob[HALF + j] = KVALUES_MXFP4[b >> 4] * d


# ---------------------------------------------------------------- parallel row kernels
# Rows are contiguous, so block b of a chunk reads x[b*QK:] and writes y[b*bytes:], whatever
# the row length.

GROUP = 64  # blocks per work item of the kernels that take a first pass over a group of blocks
Q4_0, Q4_1, Q5_0, Q5_1 = 0, 1, 2, 3       # the kinds block_scales and quantize_groups serve
LEVELS = np.array([-8.0, 15.0, -16.0, 31.0], np.float32)   # d = max / -8 (-16), or (max - min) / 15 (31)


@njit(**JIT)
def block_scales(x, lo, hi, kind, idd, d_bits, vmin, m_bits):
    """Scale fields of blocks lo..hi-1, as a first pass: the max (or min/max) loops of consecutive
    blocks then overlap in the CPU instead of each waiting inside one block's quantization, and the
    divisions and fp16 roundings run as vector loops over the blocks. Fills idd (1/d), d_bits (d's
    fp16 bits) and, for Q4_1/Q5_1, vmin and m_bits (the min's)."""
    n = hi - lo
    two_sided = kind == Q4_1 or kind == Q5_1
    for b in range(lo, hi):
        if two_sided:
            vmin[b - lo], idd[b - lo] = min_max(x[b * QK:(b + 1) * QK])     # idd holds the max for now
        else:
            idd[b - lo] = signed_absmax(x[b * QK:(b + 1) * QK])[1]
    levels = LEVELS[kind]
    for i in range(n):
        d = (idd[i] - vmin[i]) / levels if two_sided else idd[i] / levels
        idd[i] = np.float32(1.0) / d if d != F0 else F0
        d_bits[i] = fp32_to_fp16(d)
    if two_sided:
        for i in range(n):
            m_bits[i] = fp32_to_fp16(vmin[i])


@njit(parallel=True, **JIT)
def quantize_groups(x, y, kind):
    """Q4_0, Q4_1, Q5_0 or Q5_1 (kind): per group of blocks, the scales pass, then the encoding."""
    nb = x.size // QK
    for g in prange((nb + GROUP - 1) // GROUP):
        lo, hi = g * GROUP, min(nb, (g + 1) * GROUP)
        idd, vmin = np.empty(hi - lo, np.float32), np.empty(hi - lo, np.float32)
        d_bits, m_bits = np.empty(hi - lo, np.uint32), np.empty(hi - lo, np.uint32)
        block_scales(x, lo, hi, kind, idd, d_bits, vmin, m_bits)
        for b in range(lo, hi):
            i = b - lo
            if kind == Q4_0:
                encode_block_q4_0(x, b * QK, y, b * Q4_0_BYTES, idd[i], d_bits[i])
            elif kind == Q5_0:
                encode_block_q5_0(x, b * QK, y, b * Q5_0_BYTES, idd[i], d_bits[i])
            elif kind == Q4_1:
                encode_block_q4_1(x, b * QK, y, b * Q4_1_BYTES, vmin[i], idd[i], d_bits[i], m_bits[i])
            else:
                encode_block_q5_1(x, b * QK, y, b * Q5_1_BYTES, vmin[i], idd[i], d_bits[i], m_bits[i])


@njit(**JIT)
def quantize_q4_0(x, y):
    quantize_groups(x, y, Q4_0)


@njit(**JIT)
def quantize_q4_1(x, y):
    quantize_groups(x, y, Q4_1)


@njit(**JIT)
def quantize_q5_0(x, y):
    quantize_groups(x, y, Q5_0)


@njit(**JIT)
def quantize_q5_1(x, y):
    quantize_groups(x, y, Q5_1)


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
