"""Rows of a ggml type: quantize / dequantize / requantize, with bounded memory for big tensors."""

import threading
from collections.abc import Iterator

import numba
import numpy as np

from .errors import QuantError
from .registry import (block_size, check_row_length, dequantize_kernel, parse_qtype,
                       quantize_kernel, row_bytes, type_size)

CHUNK_VALUES = 1 << 22  # float32 values per requantize chunk: 16 MiB of scratch
_LAUNCH_LOCK = threading.Lock()


def launch(kernel, *args):
    """Run a parallel kernel. numba's fallback "workqueue" threading layer cannot run kernels
    from two Python threads at once, so launches are serialized when it may be in use (the
    omp and tbb layers are thread-safe)."""
    try:
        shared_ok = numba.threading_layer() in ("omp", "tbb")
    except ValueError:  # no parallel kernel has run yet
        shared_ok = False
    if shared_ok:
        return kernel(*args)
    with _LAUNCH_LOCK:
        return kernel(*args)


def use_threads(n: int) -> int:
    """Kernels launched from the calling Python thread use n threads (at most the cores numba has;
    numba's count is per calling thread, so e.g. a thread that scans while another converts can
    keep to one core). Returns the count it replaces."""
    before = numba.get_num_threads()
    n = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
    if n != before:         # the first launch after a change costs extra: change only when needed
        numba.set_num_threads(n)
    return before


def iter_row_chunks(nrows: int, n_per_row: int, chunk_values: int = CHUNK_VALUES) -> Iterator[slice]:
    """Row slices covering range(nrows), each at most chunk_values values (at least one row)."""
    step = max(1, chunk_values // max(1, n_per_row))
    for start in range(0, nrows, step):
        yield slice(start, min(nrows, start + step))


def _float_rows(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    if x.dtype != np.float32:
        raise QuantError(f"quantize expects float32 values, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise QuantError(f"quantize expects rows of values, got shape {x.shape}")
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]))


def _out_array(out, shape, dtype) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype)
    arr = np.asarray(out)
    if arr.dtype != dtype or arr.size != shape[0] * shape[1] or not arr.flags.c_contiguous:
        raise QuantError(f"out must be a C-contiguous {np.dtype(dtype)} array of {shape[0]}x{shape[1]}"
                         f" values, got {arr.dtype} {arr.shape}")
    if not arr.flags.writeable:
        raise QuantError("out is read-only")
    return arr.reshape(shape)


def quantize(qtype, x, out=None) -> np.ndarray:
    """Encode float32 rows as qtype; returns uint8 (nrows, row_bytes), byte-identical to ggml's
    ggml_quantize_chunk without an importance matrix. x: (nrows, n_per_row) or one 1-D row
    (leading dimensions of N-D input are flattened into rows); float16 input is widened
    exactly. out: optional preallocated destination (e.g. an np.memmap of the output file)."""
    t = parse_qtype(qtype)
    kernel = quantize_kernel(t)
    rows = _float_rows(x)
    nrows, n = rows.shape
    y = _out_array(out, (nrows, row_bytes(t, n)), np.uint8)
    launch(kernel, rows.reshape(-1), y.reshape(-1))
    return y


def _byte_rows(qtype, data, n_per_row) -> tuple[np.ndarray, int]:
    """data as a contiguous uint8 (nrows, row_bytes) array, and n_per_row."""
    if isinstance(data, np.ndarray):
        arr = np.asarray(data)
        if arr.dtype != np.uint8:  # e.g. float16 rows of an F16 tensor: same rows, as bytes
            arr = np.ascontiguousarray(np.atleast_1d(arr)).view(np.uint8)
    else:
        arr = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    if n_per_row is None:
        if arr.ndim >= 2:
            width = arr.shape[-1]
        else:
            width = arr.size
        if width == 0 or width % type_size(qtype):
            raise QuantError(f"{qtype.name} rows must be a multiple of {type_size(qtype)} bytes,"
                             f" got {width}")
        n_per_row = width // type_size(qtype) * block_size(qtype)
    width = row_bytes(qtype, n_per_row)
    if arr.size % width:
        raise QuantError(f"{arr.size} bytes is not a whole number of {qtype.name} rows of"
                         f" {n_per_row} values ({width} bytes each)")
    return np.ascontiguousarray(arr).reshape(-1, width), n_per_row


def dequantize(qtype, data, n_per_row=None, out=None) -> np.ndarray:
    """Decode qtype bytes to float32 (nrows, n_per_row), bit-identical to ggml's dequantizers.
    data: uint8 (nrows, row_bytes) or any buffer (bytes, memoryview, memmap slice); without
    n_per_row a 2-D array gives its rows and a flat buffer is one row."""
    t = parse_qtype(qtype)
    kernel = dequantize_kernel(t)
    rows, n = _byte_rows(t, data, n_per_row)
    values = _out_array(out, (rows.shape[0], n), np.float32)
    launch(kernel, rows.reshape(-1), values.reshape(-1))
    return values


def requantize(src_type, dst_type, data, n_per_row=None, out=None,
               chunk_values: int = CHUNK_VALUES) -> np.ndarray:
    """dequantize(src_type) then quantize(dst_type), chunk_values float32 values at a time, so
    memory stays at one chunk plus the output (which may itself be an np.memmap). The result
    equals ggml_quantize_chunk(dst, to_float(src)), i.e. llama-quantize --allow-requantize."""
    src, dst = parse_qtype(src_type), parse_qtype(dst_type)
    rows, n = _byte_rows(src, data, n_per_row)
    check_row_length(dst, n)
    quantize_kernel(dst)
    y = _out_array(out, (rows.shape[0], row_bytes(dst, n)), np.uint8)
    step = min(rows.shape[0], max(1, chunk_values // n))
    scratch = np.empty((step, n), np.float32)
    for part in iter_row_chunks(rows.shape[0], n, chunk_values):
        values = dequantize(src, rows[part], n, out=scratch[: part.stop - part.start])
        quantize(dst, values, out=y[part])
    return y
