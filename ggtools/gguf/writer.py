"""GGUFWriter: streaming, atomic GGUF output.

All KVs and tensor infos are declared first; then tensor data is streamed in the declared order, in chunks
of any size (bytes from memory, or kernel copies from another file). Padding follows the alignment the
written file itself declares. Output goes through outputs.AtomicOutput: the path is checked against the
command's inputs first, data goes to a temporary file beside the target, renamed into place only when every
tensor has been written and fsync'ed; on any error the temporary file is removed.
"""

import ctypes
import struct

from gguf import GGUFValueType as VT

from ggtools.gguf.errors import GGUFError
from ggtools.gguf.outputs import AtomicOutput, copy_range, os_error
from ggtools.gguf.reader import DEFAULT_ALIGNMENT, KV, pad
from ggtools.gguf.values import encode_kv, encode_string

WRITE_BEHIND = 64 << 20      # start the disk writes of every this many bytes while the rest is produced


def _sync_file_range():
    """Linux's sync_file_range (start writeback without waiting for it), or None elsewhere."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


SYNC_FILE_RANGE = _sync_file_range()
SYNC_FILE_RANGE_WRITE = 2


def ggml_dims(ne) -> tuple:
    """ne as ggml's own writer stores a tensor info: ggml_n_dims dimensions, i.e. those after the last one above 1
    dropped (at least one), so [224, 1] is written [224]. gguf-py stores len(shape): [224, 1] stays."""
    n_dims = max((i + 1 for i, d in enumerate(ne) if i and d > 1), default=1)
    return tuple(ne[:n_dims])


class GGUFWriter:
    def __init__(self, path, *, force: bool = False, version: int = 3, inputs=(), hint=""):
        """inputs: every file the command reads; the output may be none of them (hint: what to say then).
        path None: declarations only, to preview header_bytes()."""
        self._out = None if path is None else AtomicOutput(path, inputs=inputs, force=force, hint=hint)
        self.path = "(header preview)" if path is None else self._out.path
        self.version = version
        self.kv_records: list[tuple[str, bytes]] = []
        self.alignment = DEFAULT_ALIGNMENT
        self.infos: list[tuple[str, tuple, int, int]] = []      # name, ne, type id, nbytes
        self._fh = None
        self._index = 0          # tensor being written
        self._written = 0        # bytes of it written so far
        self._pos = 0
        self._behind = 0         # writeback started for bytes [0, _behind)

    # ---- declaration ---------------------------------------------------------------------------
    def add_kv_record(self, kv: KV):
        """Copy a KV from a parsed file byte for byte."""
        self._add_record(kv.key, kv.raw, kv.vtype, kv.value if kv.key == "general.alignment" else None)

    def add_kv(self, key: str, vtype: VT, value, elem_type: VT | None = None):
        self._add_record(key, encode_kv(key, vtype, value, elem_type), vtype, value)

    def _add_record(self, key, record, vtype, value):
        self._check_not_started()
        if any(k == key for k, _ in self.kv_records):
            raise GGUFError(self.path, f"key '{key}' added twice")
        if key == "general.alignment":
            if vtype != VT.UINT32 or not (value > 0 and value & (value - 1) == 0):
                raise GGUFError(self.path, f"general.alignment must be a u32 power of two, got {value!r}")
            self.alignment = value
        self.kv_records.append((key, bytes(record)))

    def add_tensor_info(self, name: str, ne, type_id: int, nbytes: int):
        self._check_not_started()
        if len(name.encode()) >= 64:
            raise GGUFError(self.path, f"tensor name '{name}' is {len(name.encode())} bytes (at most 63)")
        self.infos.append((name, tuple(int(d) for d in ne), int(type_id), int(nbytes)))

    def _check_not_started(self):
        if self._fh is not None:
            raise GGUFError(self.path, "header already written: add KVs and tensor infos before any data")

    # ---- output --------------------------------------------------------------------------------
    def header_bytes(self) -> bytes:
        parts = [b"GGUF", struct.pack("<Iqq", self.version, len(self.infos), len(self.kv_records))]
        parts += [record for _, record in self.kv_records]
        offset = 0
        for name, ne, type_id, nbytes in self.infos:
            parts.append(encode_string(name) + struct.pack(f"<I{len(ne)}qiQ", len(ne), *ne, type_id, offset))
            offset += pad(nbytes, self.alignment)
        header = b"".join(parts)
        return header + bytes(pad(len(header), self.alignment) - len(header))

    @property
    def data_size(self) -> int:
        return sum(pad(n, self.alignment) for *_, n in self.infos)

    def _start(self):
        if self._fh is None:
            self._fh = self._out.open()
            self._pos = self._fh.write(self.header_bytes())
            self._finish_tensors()

    def _finish_tensors(self):
        """Pad and step past the current tensor once complete (and past any zero-byte tensors)."""
        while self._index < len(self.infos) and self._written == self.infos[self._index][3]:
            n = self.infos[self._index][3]
            self._pos += self._fh.write(bytes(pad(n, self.alignment) - n))
            self._index += 1
            self._written = 0

    def _room(self, n) -> str:
        if self._index >= len(self.infos):
            raise GGUFError(self.path, f"{n} bytes of data written after the last tensor")
        name, _, _, nbytes = self.infos[self._index]
        if self._written + n > nbytes:
            raise GGUFError(self.path, f"tensor '{name}' is {nbytes} bytes; got {self._written + n}")
        return name

    def write(self, data):
        """Append bytes (any buffer) to the current tensor."""
        self._start()
        n = memoryview(data).nbytes
        self._room(n)
        self._fh.write(data)
        self._pos += n
        self._written += n
        self._finish_tensors()
        self._write_behind()

    def copy_from(self, src_fd: int, src_offset: int, n: int):
        """Append n bytes read from another file at src_offset, by kernel copy where the system offers it."""
        self._start()
        self._room(n)
        self._fh.flush()
        if copy_range(src_fd, self._fh.fileno(), src_offset, self._pos, n) != n:
            raise GGUFError(self.path, "the source ended early while copying")
        self._pos += n
        self._written += n
        self._fh.seek(self._pos)
        self._finish_tensors()
        self._write_behind()

    def _write_behind(self, minimum=WRITE_BEHIND):
        """Start the disk writes of what is written so far, so that the final fsync has little left to wait
        for: a disk-bound job then writes while it computes instead of after."""
        if SYNC_FILE_RANGE is None or self._pos - self._behind < minimum:
            return
        self._fh.flush()
        SYNC_FILE_RANGE(self._fh.fileno(), self._behind, self._pos - self._behind, SYNC_FILE_RANGE_WRITE)
        self._behind = self._pos

    @property
    def temp_path(self) -> str:
        """The file being written (renamed to path by commit)."""
        self._start()
        return self._out.tmp

    def finish(self):
        """Check every tensor was written and hand the data to the OS; the temporary file is then complete
        (a caller may verify it) and commit only has to fsync and rename it."""
        self._start()
        if self._index != len(self.infos):
            name, _, _, nbytes = self.infos[self._index]
            raise GGUFError(self.path, f"closed with tensor '{name}' at {self._written} of {nbytes} bytes")
        self._fh.flush()
        self._write_behind(minimum=1)

    def commit(self):
        """finish, fsync, and rename into place."""
        self.finish()
        self._fh = None
        self._out.commit()

    def abort(self):
        self._fh = None
        self._out.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                self.commit()
                return
            except BaseException as e:
                exc = e
        self.abort()
        if isinstance(exc, OSError):
            raise os_error(self.path, exc) from None
        if exc_type is None:
            raise exc
