"""ShardOutput: one output shard written in a single pass, each tensor's bytes at the place its tensor info gives
them, hashed as they are written.

The header (KVs and tensor infos) is known before any data: the plan gives every tensor's type and size. So the
layout of the whole file is fixed up front, and tensors may be written in any order, by several threads (the
copies on one, the conversions on another), with positional writes. Each tensor's sha256 is taken from the very
buffer handed to the write, so the manifest's digests cost no second read; the disk writes of every WRITE_BEHIND
bytes are started at once, so the final fsync has little left to wait for.

The temporary file becomes the output only through commit (fsync, rename: gguf/outputs.py's AtomicOutput); on
any error it is removed.
"""

import hashlib
import os
import threading

from ggtools.engine.errors import RewriteError
from ggtools.gguf import GGUFFile
from ggtools.gguf import writer as gguf_writer
from ggtools.gguf.outputs import AtomicOutput, os_error

WRITE_BEHIND = gguf_writer.WRITE_BEHIND
WRITE_BEHIND_TAIL = 1 << 20     # a finished tensor's last bytes: their writeback started if at least this many


class ShardOutput:
    """The temporary file of one output: its header written, its tensors' regions to be filled (tensor_sink)."""

    def __init__(self, path, header: bytes, layout: GGUFFile, *, force=False, inputs=()):
        """layout: the output's header parsed (GGUFFile.from_header), which places every tensor."""
        self.path = path
        self.layout = layout
        self.header = header
        self._out = AtomicOutput(path, inputs=inputs, force=force)
        self._fd = None
        self.written: dict[str, tuple[int, int]] = {}      # tensor -> (offset, bytes) as written
        self._lock = threading.Lock()

    @property
    def temp_path(self) -> str:
        return self._out.tmp

    def open(self):
        fh = self._out.open()
        try:
            fh.write(self.header)
            fh.flush()
        except OSError as e:
            raise os_error(self.path, e) from None
        self._fd = fh.fileno()

    def tensor_sink(self, name: str) -> "TensorSink":
        t = self.layout.tensor[name]
        return TensorSink(self, name, t.data_start, t.nbytes, self.layout.alignment)

    def pwrite(self, view, offset):
        """Write all of view at offset (an OSError names the output)."""
        done = 0
        try:
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], offset + done)
        except OSError as e:
            raise os_error(self.path, e) from None

    def write_behind(self, offset, n):
        """Start the disk writes of [offset, offset + n) without waiting for them."""
        sync = gguf_writer.SYNC_FILE_RANGE          # looked up each time: tests turn it off
        if sync is not None and n > 0:
            sync(self._fd, offset, n, gguf_writer.SYNC_FILE_RANGE_WRITE)

    def record(self, name, offset, n):
        with self._lock:
            self.written[name] = (offset, n)

    def unwritten(self) -> list[str]:
        """Tensors of the layout whose bytes were not all written at their place."""
        return [t.name for t in self.layout.tensors if self.written.get(t.name) != (t.data_start, t.nbytes)]

    def commit(self):
        """fsync and rename into place."""
        self._out.commit()

    def abort(self):
        self._out.abort()


class TensorSink:
    """One tensor's region of the output: bytes appended in order, hashed as written, padded when complete."""

    def __init__(self, out: ShardOutput, name, offset, nbytes, alignment):
        self.out, self.name, self.offset, self.nbytes, self.alignment = out, name, offset, nbytes, alignment
        self.done = 0
        self.behind = 0
        self.sha = hashlib.sha256()

    def write(self, view):
        n = len(view)
        if self.done + n > self.nbytes:
            raise RewriteError(f"{self.out.path}: tensor '{self.name}' is {self.nbytes} bytes; got {self.done + n}")
        self.sha.update(view)
        self.out.pwrite(view, self.offset + self.done)
        self.done += n
        if self.done - self.behind >= WRITE_BEHIND:
            self.out.write_behind(self.offset + self.behind, self.done - self.behind)
            self.behind = self.done

    def close(self) -> str:
        """Check every byte came, write the padding up to the next tensor; returns the tensor's sha256."""
        if self.done != self.nbytes:
            raise RewriteError(f"{self.out.path}: tensor '{self.name}' got {self.done} of its {self.nbytes} bytes")
        padding = -self.nbytes % self.alignment
        if padding:
            self.out.pwrite(memoryview(bytes(padding)), self.offset + self.nbytes)
        if self.nbytes - self.behind >= WRITE_BEHIND_TAIL:      # small tails are left to the final fsync
            self.out.write_behind(self.offset + self.behind, self.nbytes - self.behind)
        self.out.record(self.name, self.offset, self.done)
        return self.sha.hexdigest()
