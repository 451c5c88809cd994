"""ggml tensor types: quantize / dequantize kernels, bit-exact with ggml's reference code.

Knows blocks, not files. See docs/quants.md.
"""

from .api import CHUNK_VALUES, dequantize, iter_row_chunks, quantize, requantize
from .errors import QuantError
from .registry import (block_size, can_quantize, fallback_type, has_dequantizer, has_quantizer,
                       parse_qtype, row_bytes, type_size)
from .rowcheck import RowCheck, can_check_row_data, check_row_data

__all__ = [
    "CHUNK_VALUES", "QuantError", "RowCheck", "block_size", "can_check_row_data", "can_quantize", "check_row_data",
    "dequantize", "fallback_type", "has_dequantizer", "has_quantizer", "iter_row_chunks",
    "parse_qtype", "quantize", "requantize", "row_bytes", "type_size",
]
