"""ctypes access to ggml's C library (libggml-base from llama-cpp-python) as a test oracle.

`load_ggml()` skips the calling test when llama_cpp is not installed. See
../shared/reference/quant-recipes.md §6. Never pass Q8_1/Q8_K to quantize: ggml aborts.
"""

import ctypes
import os

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

os.environ.setdefault("GGML_NO_BACKTRACE", "1")

ABORTING_TYPES = {GGMLQuantizationType.Q8_1, GGMLQuantizationType.Q8_K}


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


_to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


class GGML:
    """The few libggml-base entry points the quants tests need."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)
        lib.ggml_init.argtypes = [_InitParams]
        lib.ggml_init.restype = ctypes.c_void_p
        lib.ggml_init(_InitParams(1 << 20, None, False))
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p]
        lib.ggml_validate_row_data.restype = ctypes.c_bool
        lib.ggml_validate_row_data.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.lib = lib

    def quantize(self, qtype, x: np.ndarray) -> np.ndarray:
        """ggml_quantize_chunk(type, x, imatrix=NULL): the _ref quantizers llama-quantize uses."""
        qtype = GGMLQuantizationType(qtype)
        assert qtype not in ABORTING_TYPES
        x = np.ascontiguousarray(x, dtype=np.float32)
        nrows, n = x.shape
        blck, tsize = GGML_QUANT_SIZES[qtype]
        assert n % blck == 0
        out = np.zeros((nrows, n // blck * tsize), dtype=np.uint8)
        written = self.lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0,
                                               nrows, n, None)
        assert written == out.nbytes
        return out

    def dequantize(self, qtype, data: np.ndarray, n_per_row: int) -> np.ndarray:
        """The type's to_float (dequantize_row_*, ggml_fp16_to_fp32_row, ...), row by row."""
        qtype = GGMLQuantizationType(qtype)
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        blck, tsize = GGML_QUANT_SIZES[qtype]
        nrows = data.size // (n_per_row // blck * tsize)
        out = np.zeros((nrows, n_per_row), dtype=np.float32)
        to_float = _to_float_t(self.lib.ggml_get_type_traits(int(qtype)).contents.to_float)
        to_float(data.ctypes.data, out.ctypes.data, out.size)
        return out

    def validate_row_data(self, qtype, data: np.ndarray) -> bool:
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        return bool(self.lib.ggml_validate_row_data(int(qtype), data.ctypes.data, data.size))


_instance = None


def load_ggml() -> GGML:
    """The oracle, or pytest.skip when llama-cpp-python is not installed."""
    global _instance
    if _instance is None:
        llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (ggml oracle) not installed")
        path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
        if not os.path.exists(path):
            pytest.skip(f"llama-cpp-python has no {path}")
        _instance = GGML(path)
    return _instance
