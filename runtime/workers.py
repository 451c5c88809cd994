"""Workers: the runtime's own fork-join over a few threads, each running a nogil numba kernel on a
slice of the work.

Why not numba's prange: its OpenMP threads spin between parallel regions, and a forward pass has
over a hundred short regions; when another process holds a core, the spinning thread takes the
core from the thread that has work, and a 50 us matmul was measured at 8 ms. Here idle workers
block (a futex), the calling thread takes a share itself, and the kernels stay serial code.
"""

import os
import queue
import threading


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class Workers:
    """run(kernel, n_items, *args) calls kernel(*args, start, end) on n_threads contiguous slices
    of range(n_items), one in the calling thread, and returns when all are done."""

    def __init__(self, n_threads: int | None = None):
        self.n_threads = max(1, n_threads or default_threads())
        self._inboxes = []
        self._done = queue.SimpleQueue()
        for _ in range(self.n_threads - 1):
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), daemon=True).start()
            self._inboxes.append(inbox)

    def _serve(self, inbox):
        while True:
            job = inbox.get()
            if job is None:
                return
            kernel, args = job
            try:
                kernel(*args)
                self._done.put(None)
            except BaseException as e:  # handed to the caller
                self._done.put(e)

    def run(self, kernel, n_items: int, *args) -> None:
        parts = min(self.n_threads, n_items)
        if parts <= 1:
            kernel(*args, 0, n_items)
            return
        bounds = [n_items * i // parts for i in range(parts + 1)]
        for i in range(1, parts):
            self._inboxes[i - 1].put((kernel, args + (bounds[i], bounds[i + 1])))
        error = None
        try:
            kernel(*args, bounds[0], bounds[1])
        except BaseException as e:
            error = e
        for _ in range(parts - 1):
            result = self._done.get()
            error = error or result
        if error is not None:
            raise error

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        self._inboxes = []
        self.n_threads = 1

    def __del__(self):
        self.close()


_pool: Workers | None = None


def pool() -> Workers:
    """The process-wide workers (all cores unless set_threads was called)."""
    global _pool
    if _pool is None:
        _pool = Workers()
    return _pool


def set_threads(n_threads: int) -> Workers:
    global _pool
    if _pool is None or _pool.n_threads != n_threads:
        if _pool is not None:
            _pool.close()
        _pool = Workers(n_threads)
    return _pool
