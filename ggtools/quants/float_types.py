"""The float tensor types: F32 (copy), F16 and BF16 (ggml's rounding, NaN handling included).

Kernels take flat arrays like the block kernels: float32 values and the raw uint8 bytes.
"""

import numpy as np
from numba import njit, prange

from .floatbits import FP16_TO_F32, JIT, f32_from_bits, fp32_to_bf16, fp32_to_fp16


@njit(parallel=True, **JIT)
def _to_f16(x, h):
    for i in prange(x.size):
        h[i] = fp32_to_fp16(x[i])


@njit(parallel=True, **JIT)
def _from_f16(h, out):
    for i in prange(out.size):
        out[i] = FP16_TO_F32[h[i]]


@njit(parallel=True, **JIT)
def _to_bf16(x, h):
    for i in prange(x.size):
        h[i] = fp32_to_bf16(x[i])


@njit(parallel=True, **JIT)
def _from_bf16(h, out):
    for i in prange(out.size):
        out[i] = f32_from_bits(np.uint32(h[i]) << np.uint32(16))


def quantize_f32(x, y):
    y.view(np.float32)[:] = x


def dequantize_f32(src, out):
    out[:] = src.view(np.float32)


def quantize_f16(x, y):
    _to_f16(x, y.view(np.uint16))


def dequantize_f16(src, out):
    _from_f16(src.view(np.uint16), out)


def quantize_bf16(x, y):
    _to_bf16(x, y.view(np.uint16))


def dequantize_bf16(src, out):
    _from_bf16(src.view(np.uint16), out)
