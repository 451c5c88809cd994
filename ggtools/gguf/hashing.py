"""sha256 of a GGUF file and of each tensor's bytes, in one sequential pass.

Reads go through the file descriptor into one reused buffer (not the memory map), so hashing a 47 GB shard
keeps the process's resident memory at the buffer size.
"""

import hashlib
import os

from ggtools.gguf.reader import GGUFFile

HASH_CHUNK = 16 << 20


def hash_file(f: GGUFFile, tensors=True) -> tuple[str, dict[str, str]]:
    """(sha256 of the whole file, {tensor name: sha256 of its nbytes}); tensors=False skips the per-tensor
    hashes (for files whose layout is broken)."""
    whole, per_tensor = hashlib.sha256(), {}
    spans = sorted((t.data_start, t.data_start + t.nbytes, t.name) for t in f.tensors) if tensors else []
    buf = bytearray(HASH_CHUNK)
    pos = 0
    for start, end, name in spans:
        feed(f.fd, pos, start, buf, whole)
        h = hashlib.sha256()
        feed(f.fd, start, end, buf, whole, h)
        per_tensor[name] = h.hexdigest()
        pos = end
    feed(f.fd, pos, f.file_size, buf, whole)
    return whole.hexdigest(), per_tensor


def hash_range(fd: int, start: int, end: int) -> str:
    h = hashlib.sha256()
    feed(fd, start, end, bytearray(HASH_CHUNK), h)
    return h.hexdigest()


def feed(fd, start, end, buf, *hashes):
    """Feed bytes [start, end) of the file to every hash."""
    view = memoryview(buf)
    pos = start
    while pos < end:
        n = os.preadv(fd, [view[:min(len(buf), end - pos)]], pos)
        if n <= 0:
            raise OSError(f"file ends at byte {pos}, expected data up to {end}")
        for h in hashes:
            h.update(view[:n])
        pos += n
