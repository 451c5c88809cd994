"""GGUFFile: a lazy, memory-mapped parse of one GGUF file (header, KVs, tensor infos).

Only the structure is decoded here; a value that cannot be parsed at all raises GGUFError with the byte
offset. Rules a well-formed file must also follow (duplicates, offsets, sizes...) are checked in check.py.
Large arrays are skipped over and decoded on first access.
"""

import itertools
import mmap
import os
import struct
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import GGUFValueType as VT

from ggtools.gguf.errors import GGUFError
from ggtools.gguf.inputs import regular_file
from ggtools.gguf.values import NUMPY_DTYPE, SCALAR_FORMAT, SCALAR_SIZE

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS_PARSED = 16          # more than 4 is a rule violation (check.py); more than this is garbage
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
INT64_MAX = 2 ** 63 - 1       # ggml holds dimensions in int64_t


def pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def ggml_type_name(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type{type_id}"


@dataclass
class KV:
    key: str
    vtype: VT
    start: int            # first byte of the record (the key's length prefix)
    value_start: int      # first byte of the value (after the i32 type)
    end: int              # one past the last byte of the record
    elem_type: VT | None = None
    count: int | None = None
    file: "GGUFFile" = field(default=None, repr=False, compare=False)

    @property
    def raw(self) -> bytes:
        """The record's bytes, exactly as in the file, for verbatim copying."""
        return self.file.buf[self.start:self.end]

    @property
    def is_array(self) -> bool:
        return self.vtype == VT.ARRAY

    @property
    def type_label(self) -> str:
        return f"array[{self.elem_type.name}]" if self.is_array else self.vtype.name

    @cached_property
    def value(self):
        """Decoded value: int/float/bool/str, numpy array for numeric arrays, list of str for string arrays."""
        buf, pos = self.file.buf, self.value_start
        if self.vtype == VT.STRING:
            (n,) = _U64.unpack_from(buf, pos)
            return _decode_text(buf[pos + 8:pos + 8 + n])
        if self.vtype != VT.ARRAY:
            v = struct.unpack_from(SCALAR_FORMAT[self.vtype], buf, pos)[0]
            return bool(v) if self.vtype == VT.BOOL else v
        pos += 12
        if self.elem_type == VT.STRING:
            return list(_iter_strings(buf, pos, self.count))
        arr = np.frombuffer(buf, dtype=NUMPY_DTYPE[self.elem_type], count=self.count, offset=pos)
        return arr.astype(bool) if self.elem_type == VT.BOOL else arr

    def head(self, n: int):
        """The first n elements of an array as `value` gives them, decoding no more (a 262k-token vocabulary's
        first few for a listing); the value itself for other types."""
        if not self.is_array or n >= self.count:
            return self.value
        if "value" in self.__dict__:
            return self.value[:n]
        pos = self.value_start + 12
        if self.elem_type == VT.STRING:
            return list(itertools.islice(_iter_strings(self.file.buf, pos, self.count), n))
        arr = np.frombuffer(self.file.buf, dtype=NUMPY_DTYPE[self.elem_type], count=n, offset=pos)
        return arr.astype(bool) if self.elem_type == VT.BOOL else arr


@dataclass
class TensorInfo:
    name: str
    ne: tuple              # ne[0] first (GGUF order), exactly as stored, n_dims = len(ne)
    type_id: int
    offset: int            # relative to the data section
    info_start: int
    info_end: int
    data_start: int = 0    # absolute file offset, set once the data offset is known

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.type_id)

    @property
    def block(self) -> tuple[int, int] | None:
        """(elements per block, bytes per block), or None for an unknown or deprecated type."""
        try:
            return GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        except (ValueError, KeyError):
            return None

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def shape(self) -> tuple:
        """numpy order (outermost first): the reverse of ne."""
        return tuple(reversed(self.ne))

    @property
    def row_length(self) -> int:
        return self.ne[0] if self.ne else 1

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.row_length if self.row_length else 0

    @property
    def nbytes(self) -> int | None:
        """Bytes the type and shape require, or None when the type is unknown or rows do not fill blocks."""
        block = self.block
        if block is None or not self.ne or max(self.ne) > INT64_MAX or self.ne[0] % block[0]:
            return None
        return self.n_elements // block[0] * block[1]


class GGUFFile:
    """One GGUF file, memory-mapped. Use as a context manager or call close()."""

    def __init__(self, path):
        self.path = os.fspath(path)
        regular_file(self.path)         # a FIFO would block the open, a device read forever
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise GGUFError(self.path, f"cannot read: {e.strerror or e}") from None
        self.file_size = os.fstat(self.fd).st_size
        if self.file_size == 0:
            os.close(self.fd)
            raise GGUFError(self.path, "file is empty")
        self._mmap = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        self.buf = self._mmap
        self.kvs: list[KV] = []
        self.tensors: list[TensorInfo] = []
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_header(cls, path, header: bytes, data_size: int) -> "GGUFFile":
        """A file still to be written, from its header bytes and the size of its data section: enough to
        check its rules (check.py) before any byte is written. path names it in messages."""
        f = cls.__new__(cls)
        f.path, f.fd, f._mmap, f.buf = os.fspath(path), None, None, header
        f.file_size = len(header) + data_size
        f.kvs, f.tensors = [], []
        f._parse()
        return f

    # ---- parsing -------------------------------------------------------------------------------
    def _fail(self, rule, offset):
        raise GGUFError(self.path, rule, offset)

    def _need(self, pos, n, what):
        if pos + n > self.file_size:
            self._fail(f"file ends inside {what} (needs {n} bytes, {max(0, self.file_size - pos)} left)", pos)

    def _read(self, st: struct.Struct, pos, what):
        self._need(pos, st.size, what)
        return st.unpack_from(self.buf, pos)[0], pos + st.size

    def _read_string(self, pos, what):
        n, p = self._read(_U64, pos, f"the length of {what}")
        self._need(p, n, what)
        return self.buf[p:p + n], p + n

    def _parse(self):
        self._need(0, 4, "the magic")
        magic = self.buf[:4]
        if magic != GGUF_MAGIC:
            self._fail(f"bad magic {magic!r}, expected b'GGUF': not a GGUF file", 0)
        version, pos = self._read(_U32, 4, "the version")
        if version == 0:
            self._fail("bad GGUF version 0", 4)
        if version & 0xFFFF == 0:
            self._fail(f"version reads as {version:#x}: a big-endian (byte-swapped) GGUF; "
                       "ggtools reads little-endian files only", 4)
        if version == 1:
            self._fail("GGUF version 1 is no longer supported (versions 2 and 3 are)", 4)
        if version > 3:
            self._fail(f"GGUF version {version} is newer than this reader supports (2 and 3)", 4)
        self.version = version
        self.n_tensors, pos = self._read(_U64, pos, "the tensor count")
        self.n_kv, pos = self._read(_U64, pos, "the KV count")
        remaining = self.file_size - pos
        if self.n_kv > remaining // 13:
            self._fail(f"KV count {self.n_kv} is impossible for a file of {self.file_size} bytes", 16)
        if self.n_tensors > remaining // 32:
            self._fail(f"tensor count {self.n_tensors} is impossible for a file of {self.file_size} bytes", 8)
        for _ in range(self.n_kv):
            kv = self._parse_kv(pos)
            self.kvs.append(kv)
            pos = kv.end
        self.kv = {}
        for kv in self.kvs:
            self.kv.setdefault(kv.key, kv)
        for _ in range(self.n_tensors):
            t = self._parse_tensor_info(pos)
            self.tensors.append(t)
            pos = t.info_end
        self.infos_end = pos
        self.alignment = self._layout_alignment()
        self.data_offset = pad(pos, self.alignment)
        for t in self.tensors:
            t.data_start = self.data_offset + t.offset
        self.tensor = {}
        for t in self.tensors:
            self.tensor.setdefault(t.name, t)

    def _parse_kv(self, start) -> KV:
        raw_key, pos = self._read_string(start, "a KV key")
        key = self._text(raw_key, start, "KV key")
        type_id, pos = self._read(_U32, pos, f"the type of key '{key}'")
        vtype = self._value_type(type_id, key, pos - 4)
        value_start = pos
        if vtype == VT.STRING:
            _, pos = self._read_string(pos, f"the value of key '{key}'")
            return KV(key, vtype, start, value_start, pos, file=self)
        if vtype != VT.ARRAY:
            self._need(pos, SCALAR_SIZE[vtype], f"the value of key '{key}'")
            return KV(key, vtype, start, value_start, pos + SCALAR_SIZE[vtype], file=self)
        elem_id, pos = self._read(_U32, pos, f"the element type of key '{key}'")
        if elem_id == VT.ARRAY:
            self._fail(f"key '{key}' is an array of arrays, which GGUF readers reject", pos - 4)
        elem_type = self._value_type(elem_id, key, pos - 4)
        count, pos = self._read(_U64, pos, f"the length of array '{key}'")
        if elem_type == VT.STRING:
            pos = self._skip_strings(pos, count, key)
        else:
            self._need(pos, count * SCALAR_SIZE[elem_type], f"array '{key}' ({count} elements)")
            pos += count * SCALAR_SIZE[elem_type]
        return KV(key, vtype, start, value_start, pos, elem_type, count, file=self)

    def _skip_strings(self, pos, count, key):
        if count > (self.file_size - pos) // 8:
            self._fail(f"array '{key}' claims {count} strings, more than the file can hold", pos)
        unpack, buf, start = _U64.unpack_from, self.buf, pos
        try:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        except (struct.error, OverflowError):      # read past the end
            pos = self.file_size + 1
        if pos > self.file_size:
            self._fail(f"file ends inside string array '{key}' ({count} strings)", start)
        return pos

    def _parse_tensor_info(self, start) -> TensorInfo:
        raw_name, pos = self._read_string(start, "a tensor name")
        name = self._text(raw_name, start, "tensor name")
        n_dims, pos = self._read(_U32, pos, f"n_dims of tensor '{name}'")
        if n_dims > MAX_DIMS_PARSED:
            self._fail(f"tensor '{name}' has {n_dims} dimensions (at most 4 are allowed)", pos - 4)
        self._need(pos, 8 * n_dims + 12, f"the info of tensor '{name}'")
        ne = struct.unpack_from(f"<{n_dims}Q", self.buf, pos)
        pos += 8 * n_dims
        type_id, pos = self._read(_U32, pos, f"the type of tensor '{name}'")
        offset, pos = self._read(_U64, pos, f"the offset of tensor '{name}'")
        return TensorInfo(name, tuple(ne), type_id, offset, start, pos)

    def _value_type(self, type_id, key, offset) -> VT:
        try:
            return VT(type_id)
        except ValueError:
            self._fail(f"key '{key}' has invalid GGUF value type {type_id}", offset)

    def _text(self, raw, offset, what):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self._fail(f"{what} is not valid UTF-8: {raw[:40]!r}", offset)

    def _layout_alignment(self) -> int:
        """The alignment the data layout uses: general.alignment when it is a valid u32 power of two."""
        kv = self.kv.get("general.alignment")
        if kv is not None and kv.vtype == VT.UINT32:
            a = kv.value
            if a > 0 and a & (a - 1) == 0:
                return a
        return DEFAULT_ALIGNMENT

    # ---- access --------------------------------------------------------------------------------
    def get(self, key, default=None):
        kv = self.kv.get(key)
        return default if kv is None else kv.value

    @property
    def architecture(self) -> str | None:
        arch = self.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def data_end(self) -> int:
        """End of the data section if every tensor had its expected size (known types only)."""
        end = self.data_offset
        for t in self.tensors:
            if t.nbytes is not None:
                end = max(end, t.data_start + pad(t.nbytes, self.alignment))
        return end

    def tensor_data(self, t: TensorInfo | str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the file."""
        t = self.tensor[t] if isinstance(t, str) else t
        n = t.nbytes
        if n is None:
            raise GGUFError(self.path, f"type {t.type_name} with ne {list(t.ne)} has no defined byte size",
                            where=f"tensor '{t.name}'")
        if t.data_start + n > self.file_size:
            raise GGUFError(self.path, f"data [{t.data_start}, {t.data_start + n}) lies beyond the end of "
                            f"the file ({self.file_size} bytes)", where=f"tensor '{t.name}'")
        return np.frombuffer(self.buf, dtype=np.uint8, count=n, offset=t.data_start)

    def read_rows(self, t: TensorInfo, start: int, n: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, start+n) of a tensor as uint8 (n, row bytes), read with pread: unlike the memory
        map, streaming a huge tensor this way does not grow the process's resident memory."""
        row = t.nbytes // t.n_rows
        buf = np.empty((n, row), np.uint8) if out is None else out[:n]
        got = os.preadv(self.fd, [buf], t.data_start + start * row)
        if got != buf.nbytes:
            raise GGUFError(self.path, f"file ends inside the data ({got} of {buf.nbytes} bytes read)",
                            where=f"tensor '{t.name}'")
        return buf

    def close(self):
        try:
            if self._mmap is not None:
                self._mmap.close()
        except BufferError:
            pass      # numpy views still alive: the map (and the descriptor it holds) goes with the last of them
        self._mmap = self.buf = None      # not with this file, which its KVs keep in a reference cycle until a GC
        for kv in self.kvs:
            if isinstance(kv.__dict__.get("value"), np.ndarray):
                del kv.__dict__["value"]     # a decoded array is a view of the map
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.kvs)} KVs, {len(self.tensors)} tensors)"


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


def _iter_strings(buf, pos, count):
    unpack = _U64.unpack_from
    for _ in range(count):
        (n,) = unpack(buf, pos)
        yield _decode_text(buf[pos + 8:pos + 8 + n])
        pos += 8 + n
