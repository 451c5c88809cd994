"""Which ggml types this layer handles: their kernels, llama-quantize's shape fallback, row sizes (the block
geometry itself is geometry.py's, imported here for the modules that use both)."""

from gguf import GGMLQuantizationType

from . import block32, float_types, kdecode, kquants
from .errors import QuantError
from .geometry import block_size, parse_qtype, type_size

T = GGMLQuantizationType

# type -> (quantize kernel, dequantize kernel); kernels take flat (float32, uint8) arrays.
KERNELS = {
    T.F32: (float_types.quantize_f32, float_types.dequantize_f32),
    T.F16: (float_types.quantize_f16, float_types.dequantize_f16),
    T.BF16: (float_types.quantize_bf16, float_types.dequantize_bf16),
    T.Q4_0: (block32.quantize_q4_0, block32.dequantize_q4_0),
    T.Q4_1: (block32.quantize_q4_1, block32.dequantize_q4_1),
    T.Q5_0: (block32.quantize_q5_0, block32.dequantize_q5_0),
    T.Q5_1: (block32.quantize_q5_1, block32.dequantize_q5_1),
    T.Q8_0: (block32.quantize_q8_0, block32.dequantize_q8_0),
    T.MXFP4: (None, block32.dequantize_mxfp4),
    T.Q2_K: (kquants.quantize_q2_k, kdecode.dequantize_q2_k),
    T.Q3_K: (kquants.quantize_q3_k, kdecode.dequantize_q3_k),
    T.Q4_K: (kquants.quantize_q4_k, kdecode.dequantize_q4_k),
    T.Q5_K: (kquants.quantize_q5_k, kdecode.dequantize_q5_k),
    T.Q6_K: (kquants.quantize_q6_k, kdecode.dequantize_q6_k),
}

# llama-quantize's tensor_type_fallback, for rows the requested block size does not divide.
_FALLBACK = {
    **dict.fromkeys([T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S,
                     T.IQ4_XS], T.IQ4_NL),
    **dict.fromkeys([T.Q2_K, T.Q3_K, T.TQ1_0, T.TQ2_0], T.Q4_0),
    T.Q4_K: T.Q5_0,
    T.Q5_K: T.Q5_1,
    T.Q6_K: T.Q8_0,
}


def check_row_length(qtype, ne0: int) -> None:
    """Raise QuantError unless a row of ne0 values is a whole number of blocks."""
    t = parse_qtype(qtype)
    blck = block_size(t)
    if ne0 <= 0 or ne0 % blck:
        raise QuantError(f"{t.name} needs rows that are a multiple of {blck} values, got {ne0}")


def row_bytes(qtype, ne0: int) -> int:
    """Bytes of one row of ne0 values."""
    check_row_length(qtype, ne0)
    return ne0 // block_size(qtype) * type_size(qtype)


def has_quantizer(qtype) -> bool:
    return KERNELS.get(parse_qtype(qtype), (None, None))[0] is not None


def has_dequantizer(qtype) -> bool:
    return KERNELS.get(parse_qtype(qtype), (None, None))[1] is not None


def can_quantize(qtype, ne0: int) -> bool:
    """True when this layer can write rows of ne0 values as qtype."""
    return has_quantizer(qtype) and ne0 > 0 and ne0 % block_size(qtype) == 0


def fallback_type(qtype, ne0: int) -> GGMLQuantizationType:
    """The type llama-quantize writes when asked for qtype on rows of ne0 values: qtype itself
    if the block size divides ne0, else its fallback, else F16 (tensor_type_fallback)."""
    t = parse_qtype(qtype)
    if ne0 % block_size(t) == 0:
        return t
    if t in _FALLBACK:
        fallback = _FALLBACK[t]
    elif block_size(t) <= 32:
        fallback = t
    else:
        raise QuantError(f"no tensor type fallback is defined for type {t.name}")
    return fallback if ne0 % block_size(fallback) == 0 else T.F16


def quantize_kernel(qtype):
    t = parse_qtype(qtype)
    if not has_quantizer(t):
        raise QuantError(f"quantizing to {t.name} is not supported")
    return KERNELS[t][0]


def dequantize_kernel(qtype):
    t = parse_qtype(qtype)
    if not has_dequantizer(t):
        raise QuantError(f"dequantizing {t.name} is not supported")
    return KERNELS[t][1]
