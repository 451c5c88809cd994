"""sha256 of a GGUF file and of each tensor's bytes, in one sequential pass.

Reads go through the file descriptor into a few reused buffers, a background thread reading ahead of the
hashing (gguf/readahead.py), not through the memory map: hashing a 47 GB shard keeps the process's resident
memory at the buffers' size, and every byte is read once.
"""

import hashlib

from ggtools.gguf.readahead import Piece, read_ahead, split
from ggtools.gguf.reader import GGUFFile

HASH_CHUNK = 1 << 20        # bytes per read: the buffers stay in the cores' caches


def hash_file(f: GGUFFile, tensors=True, on_chunk=None) -> tuple[str, dict[str, str]]:
    """(sha256 of the whole file, {tensor name: sha256 of its nbytes}); tensors=False skips the per-tensor
    hashes (for files whose layout is broken). on_chunk(tensor, offset_in_tensor, bytes) sees each tensor chunk
    (whole blocks) as it is read, so a scan rides on the same read."""
    whole, per_tensor = hashlib.sha256(), {}
    spans = sorted((t.data_start, t) for t in f.tensors) if tensors else []
    pieces, pos = [], 0
    for start, t in spans:
        pieces += split(pos, start - pos, HASH_CHUNK)
        pieces += _tensor_pieces(t)
        pos = start + t.nbytes
    pieces += split(pos, f.file_size - pos, HASH_CHUNK)
    hashes = {}
    for piece, view in read_ahead(f.fd, pieces, f.path):
        whole.update(view)
        t = piece.tag
        if t is not None:
            _feed_tensor(hashes, per_tensor, t, piece, view, on_chunk)
    return whole.hexdigest(), per_tensor


def content_digest(f: GGUFFile, on_chunk=None) -> tuple[str, dict[str, str]]:
    """One sha256 pass: {tensor: sha256 of its bytes} and a digest of the file's content (the header bytes
    and every tensor's hash in order, combined_digest). on_chunk(tensor, offset_in_tensor, bytes) sees each chunk
    as read; chunks hold whole blocks."""
    header = hashlib.sha256()
    pieces = split(0, f.data_offset, HASH_CHUNK) + [p for t in f.tensors for p in _tensor_pieces(t)]
    hashes, per_tensor = {}, {}
    for piece, view in read_ahead(f.fd, pieces, f.path):
        if piece.tag is None:
            header.update(view)
        else:
            _feed_tensor(hashes, per_tensor, piece.tag, piece, view, on_chunk)
    return combined_digest(header, [(t.name, per_tensor[t.name]) for t in f.tensors]), per_tensor


def combined_digest(header_sha, tensors) -> str:
    """The content digest: sha256 over the header bytes, then each (tensor name, its sha256) in file order.
    header_sha: a sha256 object that has seen the header bytes (it is updated)."""
    for name, sha in tensors:
        header_sha.update(name.encode() + b"\0" + bytes.fromhex(sha))
    return header_sha.hexdigest()


def _tensor_pieces(t) -> list[Piece]:
    """A tensor's bytes as pieces of whole blocks (one empty piece for an empty tensor, so it gets a hash)."""
    return split(t.data_start, t.nbytes, HASH_CHUNK, t, t.block[1]) or [Piece(t.data_start, 0, t)]


def _feed_tensor(hashes, per_tensor, t, piece, view, on_chunk):
    h = hashes.get(t.name)
    if h is None:
        h = hashes[t.name] = hashlib.sha256()
    h.update(view)
    offset = piece.offset - t.data_start
    if on_chunk is not None:
        on_chunk(t, offset, view)
    if offset + piece.size == t.nbytes:
        per_tensor[t.name] = hashes.pop(t.name).hexdigest()
