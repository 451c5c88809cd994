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


_from_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_vec_dot_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _TypeTraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


class GGMLCpu:
    """libggml-cpu's kernels: a weight type's input rounding (from_float of its vec_dot_type), its vec_dot, and
    the 8x8 gemv / gemm that llama.cpp runs repacked Q4_0, MXFP4 and Q4_K weights through on AVX2."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)
        lib.ggml_cpu_init.argtypes = []
        lib.ggml_cpu_init()
        lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TypeTraitsCpu)
        lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        for kernel in ("gemv", "gemm"):
            for name in REPACKED_KERNELS.values():
                getattr(lib, f"ggml_{kernel}_{name}").argtypes = [
                    ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                    ctypes.c_int]
        for name in ("q8_0", "q8_K"):
            getattr(lib, f"ggml_quantize_mat_{name}_4x8").argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self.lib = lib

    def _traits(self, qtype):
        return self.lib.ggml_get_type_traits_cpu(int(qtype)).contents

    def prepare(self, qtype, x: np.ndarray) -> np.ndarray:
        """x (rows, n) rounded as the CPU backend rounds a matmul input for weights of qtype: rows of bytes."""
        vec_dot_type = self._traits(qtype).vec_dot_type
        x = np.ascontiguousarray(x, dtype=np.float32)
        blck, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(vec_dot_type)]
        out = np.zeros((x.shape[0], x.shape[1] // blck * tsize), dtype=np.uint8)
        from_float = _from_float_t(self._traits(vec_dot_type).from_float)
        for r in range(x.shape[0]):
            from_float(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
        return out

    def vec_dot(self, qtype, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """w (rows, bytes) weight rows . x (rows, n) float inputs: (x rows, w rows), one vec_dot call each."""
        n = x.shape[1]
        xq = self.prepare(qtype, x)
        w = np.ascontiguousarray(w, dtype=np.uint8)
        vec_dot = _vec_dot_t(self._traits(qtype).vec_dot)
        out = np.zeros((x.shape[0], w.shape[0]), dtype=np.float32)
        for t in range(x.shape[0]):
            for r in range(w.shape[0]):
                vec_dot(n, out[t:t + 1, r:r + 1].ctypes.data, 0, w[r].ctypes.data, 0, xq[t].ctypes.data, 0, 1)
        return out

    def matmul_repacked(self, qtype, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """w (rows, bytes), Q4_0, MXFP4 or Q4_K rows (a multiple of 8) repacked as llama.cpp's CPU_REPACK buffer
        holds them, times x (rows, n) as its forward_mul_mat runs them: input rows in groups of 4 through
        ggml_gemm_<type>_8x8_<q8 type> (inputs rounded by ggml_quantize_mat_<q8 type>_4x8) when there are more than
        3, the rest one at a time through ggml_gemv_<type>_8x8_<q8 type> (the q8 type's from_float): (x rows, w
        rows)."""
        n_rows, n = w.shape[0], x.shape[1]
        qtype = GGMLQuantizationType(qtype)
        packed = repack_8x8(qtype, w)
        name = REPACKED_KERNELS[qtype]
        gemm, gemv = getattr(self.lib, f"ggml_gemm_{name}"), getattr(self.lib, f"ggml_gemv_{name}")
        quantize_mat = getattr(self.lib, f"ggml_quantize_mat_{name.split('_8x8_')[1]}_4x8")
        blck, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(self._traits(qtype).vec_dot_type)]
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros((x.shape[0], n_rows), dtype=np.float32)
        n_gemm = x.shape[0] - x.shape[0] % 4 if x.shape[0] > 3 else 0
        if n_gemm:
            xq = np.zeros((n_gemm, n // blck * tsize), dtype=np.uint8)     # 4 rows interleaved per group
            for t in range(0, n_gemm, 4):
                quantize_mat(x[t].ctypes.data, xq[t].ctypes.data, n)
            gemm(n, out.ctypes.data, n_rows, packed.ctypes.data, xq.ctypes.data, n_gemm, n_rows)
        for t in range(n_gemm, x.shape[0]):
            xq = self.prepare(qtype, x[t:t + 1])
            gemv(n, out[t].ctypes.data, 0, packed.ctypes.data, xq.ctypes.data, 1, n_rows)
        return out


REPACKED_KERNELS = {GGMLQuantizationType.Q4_0: "q4_0_8x8_q8_0", GGMLQuantizationType.MXFP4: "mxfp4_8x8_q8_0",
                    GGMLQuantizationType.Q4_K: "q4_K_8x8_q8_K"}
# per repacked 32-value type: bytes of a block's scale, and the mask make_block_<type>x8 XORs the values with (Q4_0's
# unsigned nibbles become signed ones)
REPACKED_BLOCKS = {GGMLQuantizationType.Q4_0: (2, 0x88), GGMLQuantizationType.MXFP4: (1, 0x00)}


def repack_8x8(qtype, w: np.ndarray) -> np.ndarray:
    """Rows w (a multiple of 8) of a 32-value 4-bit type as make_block_q4_0x8 / make_block_mxfp4x8 interleave them
    (8 bytes at a time): per group of 8 rows and block, the 8 rows' scales, then 16 chunks of 8 bytes, chunk i
    from row i % 8, bytes (i // 8) * 8 onwards. Q4_K: repack_q4_k_8x8."""
    if GGMLQuantizationType(qtype) == GGMLQuantizationType.Q4_K:
        return repack_q4_k_8x8(w)
    scale_bytes, mask = REPACKED_BLOCKS[GGMLQuantizationType(qtype)]
    n_rows = w.shape[0]
    blocks = np.ascontiguousarray(w, dtype=np.uint8).reshape(n_rows // 8, 8, -1, scale_bytes + 16)
    groups, n_blocks = n_rows // 8, blocks.shape[2]
    packed = np.empty((groups, n_blocks, 8 * scale_bytes + 128), dtype=np.uint8)
    packed[..., :8 * scale_bytes] = blocks[..., :scale_bytes].transpose(0, 2, 1, 3).reshape(groups, n_blocks, -1)
    qs = blocks[..., scale_bytes:].transpose(0, 2, 1, 3) ^ np.uint8(mask)     # (group, block, row, 16)
    for i in range(16):
        at = 8 * scale_bytes + 8 * i
        packed[..., at:at + 8] = qs[:, :, i % 8, (i // 8) * 8:(i // 8) * 8 + 8]
    return packed


def repack_q4_k_8x8(w: np.ndarray) -> np.ndarray:
    """Q4_K rows (a multiple of 8) as make_block_q4_Kx8 interleaves them: per group of 8 rows and super-block, the
    8 rows' d, then their dmin (f16), 96 bytes of scales and mins (per sub-block, the 8 rows' 6-bit scales and mins
    in 12 bytes), then 128 chunks of 8 bytes of quants, chunk i from row i % 8, bytes (i // 8) * 8 onwards."""
    n_rows = w.shape[0]
    blocks = np.ascontiguousarray(w, dtype=np.uint8).reshape(n_rows // 8, 8, -1, 144)
    groups, n_blocks = n_rows // 8, blocks.shape[2]
    packed = np.empty((groups, n_blocks, 1152), dtype=np.uint8)
    packed[..., 0:16] = blocks[..., 0:2].transpose(0, 2, 1, 3).reshape(groups, n_blocks, 16)
    packed[..., 16:32] = blocks[..., 2:4].transpose(0, 2, 1, 3).reshape(groups, n_blocks, 16)
    sc = blocks[..., 4:16].transpose(0, 2, 1, 3).astype(np.int64)          # (group, block, row, 12)
    for half in range(2):
        for i in range(4):
            if half == 0:
                s, m = sc[..., i] & 63, sc[..., i + 4] & 63
            else:
                s = ((sc[..., i] & 192) >> 2) | (sc[..., i + 8] & 15)
                m = ((sc[..., i + 4] & 192) >> 2) | ((sc[..., i + 8] & 240) >> 4)
            at = 32 + 48 * half + 12 * i
            packed[..., at:at + 4] = (s[..., :4] & 63) + ((s[..., 4:] & 48) << 2)
            packed[..., at + 4:at + 8] = (m[..., :4] & 63) + ((m[..., 4:] & 48) << 2)
            packed[..., at + 8:at + 12] = (s[..., 4:] & 15) + ((m[..., 4:] & 15) << 4)
    qs = blocks[..., 16:].transpose(0, 2, 1, 3)                                # (group, block, row, 128)
    for i in range(128):
        at = 128 + 8 * i
        packed[..., at:at + 8] = qs[:, :, i % 8, (i // 8) * 8:(i // 8) * 8 + 8]
    return packed


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


_libraries = {}


def _load(lib_name: str, cls):
    """cls on llama-cpp-python's lib/<lib_name>, loaded once, or pytest.skip when it is not installed."""
    if lib_name not in _libraries:
        llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (ggml oracle) not installed")
        path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", lib_name)
        if not os.path.exists(path):
            pytest.skip(f"llama-cpp-python has no {path}")
        _libraries[lib_name] = cls(path)
    return _libraries[lib_name]


def load_ggml_cpu() -> GGMLCpu:
    """libggml-cpu as an oracle, or pytest.skip when llama-cpp-python is not installed."""
    return _load("libggml-cpu.so", GGMLCpu)


def load_ggml() -> GGML:
    """The oracle, or pytest.skip when llama-cpp-python is not installed."""
    return _load("libggml-base.so", GGML)
