"""sha256 of a GGUF file and of each tensor's bytes, in one sequential pass.

Reads go through the file descriptor into one reused buffer (not the memory map), so hashing a 47 GB shard
keeps the process's resident memory at the buffer size.
"""

import hashlib
import os

from ggtools.gguf.errors import GGUFError
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
        feed(f, pos, start, buf, whole)
        h = hashlib.sha256()
        feed(f, start, end, buf, whole, h)
        per_tensor[name] = h.hexdigest()
        pos = end
    feed(f, pos, f.file_size, buf, whole)
    return whole.hexdigest(), per_tensor


def feed(f: GGUFFile, start, end, buf, *hashes):
    """Feed bytes [start, end) of the file to every hash."""
    view = memoryview(buf)
    pos = start
    while pos < end:
        n = os.preadv(f.fd, [view[:min(len(buf), end - pos)]], pos)
        if n <= 0:
            raise GGUFError(f.path, f"the file ends at byte {pos}, expected data up to {end}")
        for h in hashes:
            h.update(view[:n])
        pos += n


def content_digest(f: GGUFFile, on_chunk=None) -> tuple[str, dict[str, str]]:
    """One sha256 pass: {tensor: sha256 of its bytes} and a digest of the file's content (the header bytes
    and every tensor's hash in order). on_chunk(tensor, offset_in_tensor, bytes) sees each chunk as read,
    so a caller can compare it with another file without a second read; chunks hold whole blocks."""
    digest = hashlib.sha256()
    feed(f, 0, f.data_offset, bytearray(HASH_CHUNK), digest)
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    per_tensor = {}
    for t in f.tensors:
        h = hashlib.sha256()
        done = 0
        step = len(buf) - len(buf) % t.block[1]
        while done < t.nbytes:
            want = min(step, t.nbytes - done)
            n = os.preadv(f.fd, [view[:want]], t.data_start + done)
            if n != want:
                raise GGUFError(f.path, "the file ends inside the data", where=f"tensor '{t.name}'")
            h.update(view[:n])
            if on_chunk is not None:
                on_chunk(t, done, view[:n])
            done += n
        per_tensor[t.name] = h.hexdigest()
        digest.update(t.name.encode() + b"\0" + bytes.fromhex(per_tensor[t.name]))
    return digest.hexdigest(), per_tensor
