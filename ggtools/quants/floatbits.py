"""Scalar float tricks ggml uses, ported bit for bit to numba.

numba has no float16 and no scalar bit casts, so this module provides both: `f32_bits` /
`f32_from_bits` reinterpret a float32 as uint32 and back (compiled to a single LLVM bitcast),
and the fp16 / bf16 conversions are integer recipes copied from ggml-impl.h.

All arithmetic stays in float32: literals are np.float32 constants, never Python floats.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")

ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23, see nearest_int
MANTISSA = np.uint32(0x7FFFFF)
EXPONENT_2_23 = np.uint32(0x4B000000)
FP16_SCALE_TO_INF = np.float32(2.0**112)
FP16_SCALE_TO_ZERO = np.float32(2.0**-110)


@intrinsic
def f32_bits(typingctx, value):
    """Bits of a float32 as uint32."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def f32_from_bits(typingctx, bits):
    """float32 whose bits are the low 32 bits of an integer."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], ir.IntType(32)) if bits.bitwidth > 32 else args[0]
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


@njit(**JIT)
def nearest_int(f):
    """ggml's nearest_int: round half to even via the 1.5*2**23 trick (valid for |f| <= 4194303;
    outside that range it returns what the C code returns)."""
    bits = np.int64(f32_bits(f + ROUND_MAGIC))
    return (bits & 0x7FFFFF) - 0x400000


@njit(**JIT)
def nearest_float(f):
    """float32(nearest_int(f)) for every f, staying in 32-bit lanes: the same mantissa bits,
    put back under the exponent of 2**23 and debiased by a float subtraction (all exact).
    Vector loops use this; int64 intermediates would not vectorize on AVX2."""
    bits = np.uint32(f32_bits(f + ROUND_MAGIC) & MANTISSA)
    return f32_from_bits(np.uint32(bits | EXPONENT_2_23)) - ROUND_MAGIC


@njit(**JIT)
def fp32_to_fp16(f):
    """ggml_compute_fp32_to_fp16: round to nearest even incl. subnormals, overflow to inf,
    NaN to 0x7E00 | sign. Returns the half's bits as uint32 (32-bit lanes and selects throughout,
    so loops over many values vectorize)."""
    base = (abs(f) * FP16_SCALE_TO_INF) * FP16_SCALE_TO_ZERO
    w = f32_bits(f)
    shl1 = np.uint32(w + w)
    sign = w & U32_SIGN
    bias = shl1 & U32_EXP_MASK
    bias = U32_MIN_BIAS if bias < U32_MIN_BIAS else bias
    base = f32_from_bits(np.uint32((bias >> np.uint32(1)) + U32_BIAS_ADD)) + base
    b = f32_bits(base)
    nonsign = np.uint32(((b >> np.uint32(13)) & np.uint32(0x7C00)) + (b & np.uint32(0x0FFF)))
    nonsign = np.uint32(0x7E00) if shl1 > U32_EXP_MASK else nonsign
    return np.uint32((sign >> np.uint32(16)) | nonsign)


U32_SIGN, U32_EXP_MASK = np.uint32(0x80000000), np.uint32(0xFF000000)
U32_MIN_BIAS, U32_BIAS_ADD = np.uint32(0x71000000), np.uint32(0x07800000)


@njit(**JIT)
def fp32_to_bf16(f):
    """ggml_compute_fp32_to_bf16: round to nearest even, NaN forced quiet. Returns the bits as
    uint32 (32-bit lanes: vectorizes)."""
    u = f32_bits(f)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint32((u >> np.uint32(16)) | np.uint32(64))
    return np.uint32(np.uint32(u + np.uint32(np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))))
                     >> np.uint32(16))


def _fp16_table():
    """FP16 -> FP32 for all 65536 halves, computed as ggml_compute_fp16_to_fp32 does (the
    float multiply quiets signalling NaNs, which numpy's astype would not)."""
    h = np.arange(65536, dtype=np.uint32)
    two_w = (h << np.uint32(17)) & np.uint32(0xFFFFFFFF)
    sign = (h << np.uint32(16)) & np.uint32(0x80000000)
    exp_offset = np.uint32(0xE0 << 23)
    with np.errstate(invalid="ignore"):
        normalized = ((two_w >> np.uint32(4)) + exp_offset).view(np.float32) * np.float32(2.0**-112)
    magic = np.uint32(126 << 23)
    denormalized = ((two_w >> np.uint32(17)) | magic).view(np.float32) - np.float32(0.5)
    value = np.where(two_w < np.uint32(1 << 27), denormalized, normalized)
    return (value.view(np.uint32) | sign).view(np.float32)


FP16_TO_F32 = _fp16_table()


@njit(**JIT)
def fp16_at(buf, offset):
    """float32 value of the little-endian half stored at buf[offset]."""
    return FP16_TO_F32[np.int64(buf[offset]) | (np.int64(buf[offset + 1]) << 8)]


@njit(**JIT)
def store_fp16(buf, offset, value):
    """Store fp32_to_fp16(value) little-endian at buf[offset]."""
    h = fp32_to_fp16(value)
    buf[offset] = h & 0xFF
    buf[offset + 1] = (h >> 8) & 0xFF
