"""Checks over tensor data in one read: scan_tensors (validate --deep), scan_tensor (the runtime naming the tensor
that holds NaN/inf), RowScan (a scan riding on another pass over the bytes, e.g. validate's hashing).

The bytes are read once, in file order, by a background thread a few chunks ahead of the check (readahead.py):
the check of one chunk runs while the next is read, so a scan goes at the speed of reading the file; a file may be
read as several streams at once (scan_tensors' streams), e.g. one per core.
"""

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

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


def scan_tensors(f: GGUFFile, tensors, check, chunk_bytes: int = CHUNK_BYTES,
                 streams: int = 1) -> dict[str, tuple[int, int]]:
    """{tensor name: (bad items, index of the first bad item or -1)} for every tensor, read once in file order in
    bounded chunks; streams: runs of whole tensors of about equal bytes read and checked at once, each on threads of
    its own (the page cache copies, the disk's queue and the checks on every core)."""
    ordered = sorted(tensors, key=lambda t: t.data_start)
    runs = _runs(ordered, streams)
    scans = [RowScan(check) for _ in runs]
    if len(runs) == 1:
        _scan_run(f.fd, f.path, runs[0], scans[0], chunk_bytes)
    else:
        with _descriptions(f, len(runs)) as fds, ThreadPoolExecutor(len(runs)) as pool:
            list(pool.map(lambda fd, run, scan: _scan_run(fd, f.path, run, scan, chunk_bytes), fds, runs, scans))
    found = {name: result for scan in scans for name, result in scan.found.items()}
    return {t.name: found.get(t.name, (0, -1)) for t in tensors}


@contextlib.contextmanager
def _descriptions(f: GGUFFile, n: int):
    """n descriptors of f's open file, each with a read-ahead state of its own (the kernel's read-ahead follows one
    sequential stream per open file): f's own and the file reopened through /proc/self/fd (the same file, whatever
    its path names now); only f's own where that cannot be done."""
    fds = [f.fd]
    try:
        for _ in range(n - 1):
            try:
                fds.append(os.open(f"/proc/self/fd/{f.fd}", os.O_RDONLY))
            except OSError:
                fds.append(f.fd)
        yield fds
    finally:
        for fd in set(fds) - {f.fd}:
            os.close(fd)


def _runs(ordered, streams) -> list[list[TensorInfo]]:
    """ordered cut into at most `streams` runs of consecutive tensors, of about equal bytes."""
    total = sum(t.nbytes for t in ordered)
    runs, done = [[]], 0
    for t in ordered:
        if runs[-1] and done >= total * len(runs) / streams:
            runs.append([])
        runs[-1].append(t)
        done += t.nbytes
    return runs


def _scan_run(fd, path, tensors, scan: RowScan, chunk_bytes):
    pieces = [p for t in tensors for p in split(t.data_start, t.nbytes, chunk_bytes, t, t.block[1])]
    for piece, view in read_ahead(fd, pieces, path):
        scan.feed(piece.tag, piece.offset - piece.tag.data_start, view)


def scan_tensor(f: GGUFFile, t: TensorInfo, check, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, int]:
    """(bad items, index of the first bad item or -1) of one tensor."""
    return scan_tensors(f, [t], check, chunk_bytes)[t.name]
