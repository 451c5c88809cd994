"""llama.cpp's CPU float arithmetic (x86-64, AVX2 + FMA build), reproduced bit for bit in numba.

Why bit for bit: llama.cpp rounds every matmul input to 8-bit blocks (Q8_0 / Q8_1 / Q8_K), so a
difference in the last bit of an activation can flip one rounding and move a logit by a visible
amount; on a real model (SmolLM2) llama.cpp itself gives different greedy tokens after ~20 steps
when only its batch size changes. Agreeing token for token therefore needs the same float
operations in the same order: the 8-lane accumulators, their horizontal sums, fused multiply-adds,
and ggml's own exp. The scalar building blocks are here; the vector kernels are in simd.py.

Lane conventions used there (one __m256 = 8 float32 lanes):
- hsum8: ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))   (hsum_float_8, tinyBLAS hsum)
- reduce4x8: four accumulators folded (0+2, 1+3, 0+1), then ((t0+t1) + (t2+t3)) with
  t = low half + high half                             (GGML_F32x8_REDUCE, vec_dot_f16/f32)
"""

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from ggtools.quants.floatbits import FP16_TO_F32, f32_bits, f32_from_bits, fp32_to_fp16
from ggtools.runtime.kernels.simd import round_f16_8

EXACT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")
F32 = np.float32


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32, vfmadd on x86)."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(**EXACT)
def to_f16(x):
    """Round a float32 to the nearest float16 value (F16C, round to nearest even)."""
    return FP16_TO_F32[fp32_to_fp16(x)]


@njit(**EXACT)
def to_f16_row(src, dst):
    """dst[i] = to_f16(src[i]) for 1-D arrays, 8 values per vector instruction (same bits)."""
    n8 = src.size // 8
    round_f16_8(src, dst, n8)
    for i in range(8 * n8, src.size):
        dst[i] = to_f16(src[i])


# ggml_v_expf constants (hex floats as written in ggml-cpu/vec.h)
EXP_SHIFT = F32(float.fromhex("0x1.8p23"))
LOG2E = F32(float.fromhex("0x1.715476p+0"))
LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
EXP_P = tuple(F32(float.fromhex(h)) for h in
              ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1"))


@njit(**EXACT)
def expf(x):
    """ggml_v_expf for one lane (AVX2 + FMA): ARM's optimized-routines exp, max error 1.5 ulp."""
    p0, p1, p2, p3, p4 = EXP_P
    z = fma(x, LOG2E, EXP_SHIFT)
    n = z - EXP_SHIFT
    b = fma(-n, LN2_LO, fma(-n, LN2_HI, x))
    e = (np.int64(f32_bits(z)) << 23) & 0xFFFFFFFF
    k = f32_from_bits((e + 0x3F800000) & 0xFFFFFFFF)
    u = b * b
    j = fma(fma(fma(p0, b, p1), u, fma(p2, b, p3)), u, p4 * b)
    if not abs(n) > F32(126.0):
        return fma(j, k, k)
    g = 0x82000000 if n <= F32(0.0) else 0
    s1 = f32_from_bits((g + 0x7F000000) & 0xFFFFFFFF)
    if abs(n) > F32(192.0):
        return s1 * s1
    s2 = f32_from_bits((e - g) & 0xFFFFFFFF)
    return fma(s2, j, s2) * s1


@njit(**EXACT)
def silu(x):
    """ggml_v_silu: x / (1 + exp(-x))."""
    return x / (F32(1.0) + expf(F32(0.0) - x))
