"""One safetensors file, read lazily: the JSON header up front, tensor rows on demand with os.pread.

pread rather than mmap: pages read through a map stay resident (and count in RSS) until the map goes,
so a large checkpoint would look like it is held in memory. Here only the rows asked for are in memory.
"""

import json
import math
import os
import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from ggtools.dflash.errors import CheckpointError
from ggtools.gguf.inputs import regular_file

# safetensors dtype -> (numpy dtype of the stored values, ggml type of the same encoding)
DTYPES = {"BF16": ("<u2", T.BF16), "F16": ("<f2", T.F16), "F32": ("<f4", T.F32), "F64": ("<f8", T.F64),
          "I64": ("<i8", T.I64), "I32": ("<i4", T.I32), "I16": ("<i2", T.I16), "I8": ("i1", T.I8),
          "U8": ("u1", T.I8), "BOOL": ("u1", T.I8)}
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")     # the weights' dtypes; the others: ids and masks (DSpark's d2t, t2d)
MAX_HEADER = 100 << 20
COVERAGE = "the tensors' byte ranges follow each other, without gap or overlap, to the end of the file"


class TensorRows:
    """A source tensor's geometry from its numpy `shape` (outermost first): a GGUF row is its innermost dimension."""
    shape: tuple

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def row_length(self) -> int:
        """Values per GGUF row: the innermost dimension."""
        return self.shape[-1] if self.shape else 1

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.row_length if self.row_length else 0


@dataclass
class SourceTensor(TensorRows):
    name: str            # as stored in the file
    path: str
    dtype: str           # safetensors dtype, a key of DTYPES
    shape: tuple         # numpy order (outermost first), as stored
    offset: int          # absolute file offset of the data
    nbytes: int

    @property
    def ggml_type(self) -> T:
        return DTYPES[self.dtype][1]

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as float32, shape (stop - start, row_length). Exact for every source dtype
        except F64 (rounded to nearest, as torch's .to(float32))."""
        np_dtype = DTYPES[self.dtype][0]
        itemsize = np.dtype(np_dtype).itemsize
        row_bytes = self.row_length * itemsize
        want = (stop - start) * row_bytes
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, want, self.offset + start * row_bytes)
        finally:
            os.close(fd)
        if len(data) != want:
            raise CheckpointError(self.path, f"file ends inside the data ({len(data)} of {want} bytes)",
                                  f"tensor '{self.name}'")
        values = np.frombuffer(data, dtype=np_dtype)
        if self.dtype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        else:
            values = values.astype(np.float32, copy=False)
        return values.reshape(stop - start, self.row_length)

    def read_all(self) -> np.ndarray:
        """The whole tensor as float32 in its numpy shape (for the small ones)."""
        return self.read_rows(0, self.n_rows).reshape(self.shape)

    def read_exact(self) -> np.ndarray:
        """The whole tensor, flat, without rounding: integer dtypes as int64, float dtypes as float64 (for small
        tables of ids, e.g. DSpark's d2t)."""
        np_dtype = DTYPES[self.dtype][0]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, self.nbytes, self.offset)
        finally:
            os.close(fd)
        if len(data) != self.nbytes:
            raise CheckpointError(self.path, f"file ends inside the data ({len(data)} of {self.nbytes} bytes)",
                                  f"tensor '{self.name}'")
        values = np.frombuffer(data, dtype=np_dtype)
        if self.dtype == "BF16":
            return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return values.astype(np.float64 if self.dtype in FLOAT_DTYPES else np.int64)


def read_header(path) -> list[SourceTensor]:
    """The tensors of one safetensors file, checked against the file's size, in stored-header order."""
    path = os.fspath(path)
    size = regular_file(path).st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(path, "file is shorter than the 8-byte header length: not a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise CheckpointError(path, f"header length {n} does not fit a file of {size} bytes: "
                                            "not a safetensors file", "byte 0")
            raw = fh.read(n)
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:        # ValueError: bad JSON or UTF-8, an integer of 4300+ digits
        raise CheckpointError(path, f"header is not valid JSON: {e}", "byte 8") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "header is not a JSON object", "byte 8")
    data_start = 8 + n
    out = [_tensor(path, name, meta, data_start, size) for name, meta in header.items() if name != "__metadata__"]
    _check_coverage(path, out, data_start, size)
    return out


def _tensor(path, name, meta, data_start, size) -> SourceTensor:
    where = f"tensor '{name}'"
    try:
        dtype, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(path, "header entry needs dtype, shape and data_offsets [begin, end]", where) from None
    if not all(_count(v) for v in (*shape, begin, end)):
        raise CheckpointError(path, "shape and data_offsets must be non-negative integers", where)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(path, f"dtype {dtype} is not supported (one of {', '.join(DTYPES)})", where)
    want = math.prod(shape) * np.dtype(DTYPES[dtype][0]).itemsize
    if end - begin != want or begin < 0:
        raise CheckpointError(path, f"data_offsets [{begin}, {end}] hold {end - begin} bytes; "
                                    f"{dtype} {list(shape)} needs {want}", where)
    if data_start + end > size:
        raise CheckpointError(path, f"data [{begin}, {end}) lies beyond the end of the file", where)
    return SourceTensor(name, path, dtype, shape, data_start + begin, want)


def _check_coverage(path, tensors: list[SourceTensor], data_start: int, size: int):
    """The format's rule (the reference reader, safetensors' Metadata::validate, refuses a file that breaks it): the
    tensors' byte ranges, in offset order, follow each other without gap or overlap and end where the file ends."""
    end, last = data_start, None
    for t in sorted(tensors, key=lambda t: (t.offset, t.nbytes)):
        begin = t.offset - data_start
        if t.offset < end:
            raise CheckpointError(path, f"data_offsets [{begin}, {begin + t.nbytes}] overlap tensor '{last.name}' "
                                        f"[{last.offset - data_start}, {end - data_start}]: {COVERAGE}; the "
                                        "safetensors reader refuses it (invalid offset)", f"tensor '{t.name}'")
        if t.offset > end:
            raise CheckpointError(path, f"data_offsets [{begin}, {begin + t.nbytes}] leave bytes "
                                        f"[{end - data_start}, {begin}) of the data section to no tensor: {COVERAGE}; "
                                        "the safetensors reader refuses it (invalid offset)", f"tensor '{t.name}'")
        end, last = t.offset + t.nbytes, t
    if end != size:
        where = f"tensor '{last.name}'" if last else "byte 8"
        raise CheckpointError(path, f"the tensors' data ends at byte {end - data_start} of a data section of "
                                    f"{size - data_start} bytes: {COVERAGE}; the safetensors reader refuses it "
                                    "(incomplete metadata, file not fully covered)", where)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
