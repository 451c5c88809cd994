"""ggml tensor types: quantize / dequantize kernels, bit-exact with ggml's reference code.

Knows blocks, not files. See docs/quants.md.

- rows.py         quantize / dequantize / requantize rows of any handled type, in bounded memory
- registry.py     which types are handled: kernels, llama-quantize's shape fallback, row sizes
- geometry.py     type names and ids, block geometry (no kernels)
- float_types.py  F32, F16, BF16
- block32.py      the 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 (decode)
- kquants.py      K-quant encoders (256-value super-blocks); kdecode.py their decoders
- scalesearch.py  ggml's K-quant scale searches, lane-parallel
- floatbits.py    scalar float bit casts and fp16 / bf16 rounding, as ggml does them
- rowcheck.py     what ggml_validate_row_data rejects (validate --deep; numpy, no kernels)

Names are imported from their module on first use: the kernels (numba) load only for what needs them, so
`validate --deep`'s row checks and a plan's block sizes start without numba.
"""

import importlib

_HOMES = {
    **dict.fromkeys(["CHUNK_VALUES", "dequantize", "iter_row_chunks", "quantize", "requantize", "use_threads"], "rows"),
    "QuantError": "errors",
    **dict.fromkeys(["block_size", "parse_qtype", "type_size"], "geometry"),
    **dict.fromkeys(["can_quantize", "fallback_type", "has_dequantizer", "has_quantizer", "row_bytes"], "registry"),
    **dict.fromkeys(["RowCheck", "can_check_row_data", "check_row_data"], "rowcheck"),
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOMES))
