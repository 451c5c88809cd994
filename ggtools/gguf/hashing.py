"""sha256 of a GGUF file and of each tensor's bytes, in one sequential pass."""

import hashlib

from ggtools.gguf.reader import GGUFFile

HASH_CHUNK = 16 << 20


def hash_file(f: GGUFFile, tensors=True) -> tuple[str, dict[str, str]]:
    """(sha256 of the whole file, {tensor name: sha256 of its nbytes}); tensors=False skips the per-tensor
    hashes (for files whose layout is broken)."""
    whole, per_tensor = hashlib.sha256(), {}
    spans = sorted((t.data_start, t.data_start + t.nbytes, t.name) for t in f.tensors) if tensors else []
    pos = 0
    for start, end, name in spans:
        feed(f.buf, pos, start, whole)
        h = hashlib.sha256()
        feed(f.buf, start, end, whole, h)
        per_tensor[name] = h.hexdigest()
        pos = end
    feed(f.buf, pos, f.file_size, whole)
    return whole.hexdigest(), per_tensor


def hash_range(buf, start, end) -> str:
    h = hashlib.sha256()
    feed(buf, start, end, h)
    return h.hexdigest()


def feed(buf, start, end, *hashes):
    view = memoryview(buf)
    try:
        for pos in range(start, end, HASH_CHUNK):
            chunk = view[pos:min(end, pos + HASH_CHUNK)]
            for h in hashes:
                h.update(chunk)
    finally:
        view.release()
