"""Workers: the runtime's own fork-join over a few threads running nogil numba kernels.

Why not numba's prange: its OpenMP threads spin between parallel regions, and a forward pass has
over a hundred short regions; when another process holds a core, the spinning thread takes the
core from the thread that has work, and a 50 us matmul was measured at 8 ms.

Here a job is a list of tasks and a shared counter. Every participating thread, the caller
included, claims tasks with an atomic fetch-add until none are left, so a thread the OS does not
schedule simply does fewer tasks instead of holding the others up. The caller then waits only for
tasks already claimed (counter[1] counts threads inside the claim loop); a worker that wakes up
late finds nothing left and does nothing. Idle workers block on a queue.

`run(kernel, n_tasks, work, min_work, *args)` keeps a small job (under min_work multiply-adds) in the
calling thread: on a VM, waking a worker costs more than such a job.

Kernels follow one shape:

    @njit(nogil=True)
    def kernel(..., counter):
        enter(counter)
        while True:
            k = claim(counter)
            if k >= n_tasks: break
            ...task k...
        leave(counter)
"""

import os
import queue
import threading

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

I32, I64 = ir.IntType(32), ir.IntType(64)


def _counter_slot(context, builder, aryty, ary, index):
    array = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, array, [index], wraparound=False)


@intrinsic
def atomic_add(typingctx, counter, index, value):
    """counter[index] += value atomically; returns the old value (int64 array)."""
    def codegen(context, builder, signature, args):
        ptr = _counter_slot(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return types.int64(counter, types.intp, types.int64), codegen


@intrinsic
def atomic_get(typingctx, counter, index):
    def codegen(context, builder, signature, args):
        ptr = _counter_slot(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "seq_cst", 8)

    return types.int64(counter, types.intp), codegen


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(): let another thread (perhaps the one we wait for) have this core."""
    def codegen(context, builder, signature, args):
        module = builder.module
        fn = module.globals.get("sched_yield") or ir.Function(module, ir.FunctionType(I32, []), "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, nogil=True)
def enter(counter):
    atomic_add(counter, 1, 1)


@njit(cache=True, nogil=True)
def claim(counter):
    return atomic_add(counter, 0, 1)


@njit(cache=True, nogil=True)
def leave(counter):
    atomic_add(counter, 1, -1)


@njit(cache=True, nogil=True)
def wait_idle(counter):
    """Wait until no thread is inside the job's claim loop (called once the tasks are all claimed)."""
    while atomic_get(counter, 1) != 0:
        yield_cpu()


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class Workers:
    """run(kernel, n_tasks, *args): kernel(*args, counter) in the calling thread and in up to
    n_threads - 1 workers, sharing the n_tasks tasks; returns when all are done."""

    def __init__(self, n_threads: int | None = None):
        self.n_threads = max(1, n_threads or default_threads())
        self._inboxes = []
        for _ in range(self.n_threads - 1):
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), daemon=True).start()
            self._inboxes.append(inbox)

    @staticmethod
    def _serve(inbox):
        while True:
            job = inbox.get()
            if job is None:
                return
            kernel, args = job
            kernel(*args)

    def run(self, kernel, n_tasks: int, *args) -> None:
        counter = np.zeros(2, np.int64)
        helpers = self._inboxes[:max(0, min(self.n_threads, n_tasks) - 1)]
        for inbox in helpers:
            inbox.put((kernel, args + (counter,)))
        kernel(*args, counter)
        if helpers:
            wait_idle(counter)

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        self._inboxes = []
        self.n_threads = 1

    def __del__(self):
        self.close()


_pool: Workers | None = None

# below this many multiply-adds a job runs in the calling thread alone: waking a worker was measured at tens of
# µs on a VM (a one-row 576 x 3072 matmul took as long on two threads as on one; 576 x 12288 was 1.45x faster)
MATMUL_MIN_WORK = 1 << 21
ATTENTION_MIN_WORK = 1 << 18


def run(kernel, n_tasks: int, work: int, min_work: int, *args) -> None:
    """kernel(*args, counter) over n_tasks tasks: on the workers, or in this thread alone when `work`
    (multiply-adds) is under min_work."""
    if work >= min_work:
        pool().run(kernel, n_tasks, *args)
    else:
        kernel(*args, np.zeros(2, np.int64))


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
