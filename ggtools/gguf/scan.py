"""Checks over tensor data in one read: scan_tensors (validate --deep), scan_tensor (the runtime naming the tensor
that holds NaN/inf), RowScan (a scan riding on another pass over the bytes, e.g. validate's hashing).

The bytes are read once, in file order, by a background thread a few chunks ahead of the check (readahead.py):
the check of one chunk runs while the next is read, so a scan goes at the speed of reading the file.
"""

from ggtools.gguf.readahead import read_ahead, split
from ggtools.gguf.reader import GGUFFile, TensorInfo

CHUNK_BYTES = 1 << 20       # bytes per read: the buffers stay in the cores' caches


class RowScan:
    """check(type, bytes) -> (bad items, first bad item) accumulated over chunks of whole blocks of tensors; an
    item is a block, or a value for float types."""

    def __init__(self, check):
        self.check = check
        self.found: dict[str, tuple[int, int]] = {}

    def feed(self, t: TensorInfo, offset: int, data):
        """A chunk of t's bytes starting at offset (in bytes, a multiple of its block size) within the tensor."""
        if not len(data):
            return
        n_bad, at = self.check(t.type_id, data)
        total, first = self.found.get(t.name, (0, -1))
        if n_bad and first < 0:
            first = offset // t.block[1] + at
        self.found[t.name] = (total + n_bad, first)

    def result(self, t: TensorInfo) -> tuple[int, int]:
        return self.found.get(t.name, (0, -1))


def scan_tensors(f: GGUFFile, tensors, check, chunk_bytes: int = CHUNK_BYTES) -> dict[str, tuple[int, int]]:
    """{tensor name: (bad items, index of the first bad item or -1)} for every tensor, read once in file order in
    bounded chunks."""
    scan = RowScan(check)
    ordered = sorted(tensors, key=lambda t: t.data_start)
    pieces = [p for t in ordered for p in split(t.data_start, t.nbytes, chunk_bytes, t, t.block[1])]
    for piece, view in read_ahead(f.fd, pieces, f.path):
        scan.feed(piece.tag, piece.offset - piece.tag.data_start, view)
    return {t.name: scan.result(t) for t in tensors}


def scan_tensor(f: GGUFFile, t: TensorInfo, check, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, int]:
    """(bad items, index of the first bad item or -1) of one tensor."""
    return scan_tensors(f, [t], check, chunk_bytes)[t.name]
