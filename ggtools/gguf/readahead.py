"""read_ahead: the bytes of a file's ranges, in order, read by a background thread a few chunks ahead of the code
that consumes them.

Every byte is read once, with positional reads into a few reused buffers (resident memory stays at depth x the
largest piece, whatever the file size; pieces of about 1 MiB stay in the cores' caches). The reading thread waits
on the disk, or copies out of the page cache, while the consumer hashes, scans or converts the previous chunk on
another core; the kernel is told the access is sequential, and asked for the next piece early where the pieces
jump.
"""

import os
import queue
import threading
from collections.abc import Iterable, Iterator

from ggtools.gguf.errors import GGUFError

DEPTH = 3              # buffers: one being consumed, the others being filled


class Piece:
    """A byte range to read and what the consumer knows it by."""

    __slots__ = ("offset", "size", "tag")

    def __init__(self, offset: int, size: int, tag=None):
        self.offset, self.size, self.tag = offset, size, tag


def advise(fd: int, offset: int, size: int, advice_name: str):
    """posix_fadvise where the system has it (a hint: failures are ignored)."""
    advice = getattr(os, advice_name, None)
    if advice is None or not hasattr(os, "posix_fadvise"):
        return
    try:
        os.posix_fadvise(fd, offset, size, advice)
    except OSError:
        pass


def read_ahead(fd: int, pieces: Iterable[Piece], path: str, depth: int = DEPTH) -> Iterator[tuple[Piece, memoryview]]:
    """(piece, its bytes) for every piece in order; the bytes are valid until the next item is asked for. path
    names the file in errors (a file that ends early)."""
    pieces = list(pieces)
    if not pieces:
        return
    largest = max(p.size for p in pieces)
    free = queue.Queue()
    for _ in range(min(depth, len(pieces))):
        free.put(bytearray(largest))
    full = queue.Queue()
    stop = threading.Event()
    advise(fd, 0, 0, "POSIX_FADV_SEQUENTIAL")
    reader = threading.Thread(target=_fill, args=(fd, pieces, path, free, full, stop), daemon=True,
                              name="ggtools-read-ahead")
    reader.start()
    try:
        for _ in pieces:
            item = full.get()
            if isinstance(item, BaseException):
                raise item
            piece, buf = item
            yield piece, memoryview(buf)[:piece.size]
            free.put(buf)
    finally:
        stop.set()
        free.put(None)          # wakes a reader waiting for a buffer
        reader.join()


def _fill(fd, pieces, path, free, full, stop):
    try:
        for i, piece in enumerate(pieces):
            buf = free.get()
            if buf is None or stop.is_set():
                return
            if i + 1 < len(pieces) and pieces[i + 1].offset != piece.offset + piece.size:
                # a jump, which the kernel's read-ahead cannot guess: it starts on the next piece while this one
                # is copied out (sequential pieces need no hint: asking costs a walk of the cached pages)
                advise(fd, pieces[i + 1].offset, pieces[i + 1].size, "POSIX_FADV_WILLNEED")
            _read_exactly(fd, memoryview(buf)[:piece.size], piece.offset, path)
            full.put((piece, buf))
    except BaseException as e:      # handed to the consumer, which raises it
        full.put(e)


def _read_exactly(fd, view, offset, path):
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise GGUFError(path, f"the file ends at byte {offset + done}, expected data up to {offset + len(view)}")
        done += n


def split(offset: int, size: int, chunk: int, tag=None, align: int = 1) -> list[Piece]:
    """[offset, offset + size) as pieces of at most chunk bytes, each a multiple of align (whole blocks) but the
    last."""
    step = max(align, chunk - chunk % align)
    return [Piece(offset + done, min(step, size - done), tag) for done in range(0, size, step)]
