"""ggml tensor types: quantize / dequantize kernels, bit-exact with ggml's reference code.

Knows blocks, not files. See docs/quants.md.

- rows.py         quantize / dequantize / requantize rows of any handled type, in bounded memory
- registry.py     which types are handled: block geometry, kernels, llama-quantize's shape fallback
- float_types.py  F32, F16, BF16
- block32.py      the 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 (decode)
- kquants.py      K-quant encoders (256-value super-blocks); kdecode.py their decoders
- scalesearch.py  ggml's K-quant scale searches, lane-parallel
- floatbits.py    scalar float bit casts and fp16 / bf16 rounding, as ggml does them
- rowcheck.py     what ggml_validate_row_data rejects (validate --deep)
"""

from .rows import CHUNK_VALUES, dequantize, iter_row_chunks, quantize, requantize, use_threads
from .errors import QuantError
from .registry import (block_size, can_quantize, fallback_type, has_dequantizer, has_quantizer,
                       parse_qtype, row_bytes, type_size)
from .rowcheck import RowCheck, can_check_row_data, check_row_data

__all__ = [
    "CHUNK_VALUES", "QuantError", "RowCheck", "block_size", "can_check_row_data", "can_quantize", "check_row_data",
    "dequantize", "fallback_type", "has_dequantizer", "has_quantizer", "iter_row_chunks",
    "parse_qtype", "quantize", "requantize", "row_bytes", "type_size", "use_threads",
]
