"""Workers: the runtime's own fork-join over a few threads running nogil numba kernels.

Why not numba's prange: its OpenMP threads spin between parallel regions without bound, and a forward pass
has over a hundred short regions; when another process held a core, the spinning thread took the core from
the thread that had work, and a 50 us matmul was measured at 8 ms.

A job is a list of tasks and a shared counter. Every participating thread, the caller included, claims tasks
with an atomic fetch-add until none are left, so a thread the OS does not schedule simply does fewer tasks
instead of holding the others up; the caller then waits only for tasks already claimed. Kernels follow one
shape:

    @njit(nogil=True)
    def kernel(..., counter):
        enter(counter)
        while True:
            k = claim(counter)
            if k >= n_tasks: break
            ...task k...
        leave(counter)

Two ways to hand a job to the workers:

- `run_job(job, ...)`, the fast path (the matmuls, dozens per token): a worker that finished a job keeps
  polling, GIL-free inside numba, for SPIN_SECONDS before it goes to sleep. The caller's `job.post` (numba)
  writes the arguments' addresses and shapes into the shared control array and bumps a generation number;
  a polling worker sees it within a fraction of a microsecond and calls the job's entry (a C function that
  rebuilds the arrays and runs the kernel) without touching Python. A decode step's matmuls follow each
  other within microseconds, so through a forward pass the workers never sleep, and a matmul of 50 us splits
  across threads as llama.cpp's graph splits it; waking a sleeping thread (tens of us on a VM) is paid once
  per burst. The spinning is bounded, so a process that stops computing gives its cores back within
  SPIN_SECONDS.
- `run(kernel, ...)`, the general path (attention, the delta rule: their arguments include strided views):
  the job goes through each worker's queue; a polling worker leaves its loop to take it.

Generation protocol of the fast path (control[GEN]): odd = no job, even = a job whose arguments are written.
The caller writes arguments only while it is odd and no worker is active; a worker counts itself active, then
checks the generation is still the one it saw, and only then reads the arguments; the caller closes a job
(makes the generation odd) and waits for the active count to drop to 0 before it returns, so the arrays a
worker reads are alive.

`run(kernel, n_tasks, work, min_work, *args)` and `run_job` keep a small job (under min_work multiply-adds) in
the calling thread.
"""

import os
import queue
import threading
import time

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

I32, I64 = ir.IntType(32), ir.IntType(64)
X86 = llvm_binding.get_process_triple().split("-")[0] in ("x86_64", "i686", "i386")

# the control array: the kernel's counter (claims, threads inside), the generation, the active workers, the job's
# entry and arguments, then each worker's "leave the loop" flag (each group on its own cache lines)
CLAIM, INSIDE, GEN, ACTIVE, ENTRY, ARGS, EXIT = 0, 1, 8, 16, 64, 65, 128
MAX_THREADS = 1024          # the caller and 1023 workers: a two-socket EPYC's hardware threads, and more
CONTROL_SIZE = EXIT + MAX_THREADS
SPIN_SECONDS = 500e-6     # how long an idle worker polls for the next job before it sleeps
IDLE, LEFT = 0, 1         # why serve returned


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


def _libc_call(builder, name, ret, arg_types, args):
    module = builder.module
    fn = module.globals.get(name) or ir.Function(module, ir.FunctionType(ret, arg_types), name)
    return builder.call(fn, args)


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(): let another thread (perhaps the one we wait for) have this core."""
    def codegen(context, builder, signature, args):
        _libc_call(builder, "sched_yield", I32, [], [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def cpu_relax(typingctx):
    """The x86 pause instruction in a polling loop (nothing elsewhere)."""
    def codegen(context, builder, signature, args):
        if X86:
            _libc_call(builder, "llvm.x86.sse2.pause", ir.VoidType(), [], [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def monotonic_ns(typingctx):
    """clock_gettime(CLOCK_MONOTONIC) in nanoseconds (the vDSO: tens of ns, no system call)."""
    def codegen(context, builder, signature, args):
        ts = cgutils.alloca_once(builder, ir.ArrayType(I64, 2))
        _libc_call(builder, "clock_gettime", I32, [I32, ts.type], [ir.Constant(I32, 1), ts])
        sec = builder.load(builder.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
        nsec = builder.load(builder.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
        return builder.add(builder.mul(sec, ir.Constant(I64, 1_000_000_000)), nsec)

    return types.int64(), codegen


@intrinsic
def address_as_pointer(typingctx, address):
    """An int64 address as a void pointer (for numba.carray)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@intrinsic
def call_entry(typingctx, entry, control):
    """entry(&control[0]): a job's C entry (a numba cfunc taking the control array's address)."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [I64.as_pointer()])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        data = context.make_array(signature.args[1])(context, builder, args[1]).data
        builder.call(fn, [builder.bitcast(data, I64.as_pointer())])
        return context.get_dummy_value()

    return types.void(types.int64, control), codegen


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
def restart(counter):
    """A fresh count on counter for the next kernel: its claim and inside slots only (a one-call path's counter may be
    the pool's control array, whose other slots are the workers')."""
    counter[CLAIM] = 0
    counter[INSIDE] = 0


@njit(cache=True, nogil=True)
def wait_zero(array, index):
    """Spin until array[index] is 0, then yield the CPU between polls."""
    spins = 0
    while atomic_get(array, index) != 0:
        spins += 1
        if spins < 4096:
            cpu_relax()
        else:
            yield_cpu()


@njit(cache=True, nogil=True)
def wait_idle(counter):
    """Wait until no thread is inside the job's claim loop (called once the tasks are all claimed)."""
    wait_zero(counter, 1)


# ---- the fast path: a job's arguments in the control array ----------------------------------------------

ENTRY_SIGNATURE = types.void(types.CPointer(types.int64))    # a job's entry: a cfunc taking the control's address
CFUNC = dict(cache=True, error_model="numpy")


@njit(cache=True, nogil=True)
def put_array(control, i, a):
    """Write a C-contiguous array's address and shape at control[i:]; returns the next free index."""
    control[i] = a.ctypes.data
    for k in range(a.ndim):
        control[i + 1 + k] = a.shape[k]
    return i + 1 + a.ndim


@njit(cache=True, nogil=True)
def put_rows(control, i, a):
    """Write a 2-D array of unit-stride rows (a column range of a wider array, say) at control[i:]: its address,
    shape and row stride; returns the next free index."""
    control[i], control[i + 1], control[i + 2] = a.ctypes.data, a.shape[0], a.shape[1]
    control[i + 3] = a.strides[0] // a.itemsize
    return i + 4


@njit(cache=True, nogil=True)
def rows_2d(control, i, dtype):
    """The array put_rows wrote: full rows of the row stride, cut to its columns."""
    full = carray(address_as_pointer(control[i]), (control[i + 1], control[i + 3]), dtype)
    return full[:, :control[i + 2]], i + 4


@njit(cache=True, nogil=True)
def array_1d(control, i, dtype):
    return carray(address_as_pointer(control[i]), (control[i + 1],), dtype), i + 2


@njit(cache=True, nogil=True)
def array_2d(control, i, dtype):
    return carray(address_as_pointer(control[i]), (control[i + 1], control[i + 2]), dtype), i + 3


@njit(cache=True, nogil=True)
def array_3d(control, i, dtype):
    return carray(address_as_pointer(control[i]), (control[i + 1], control[i + 2], control[i + 3]), dtype), i + 4


@njit(cache=True, nogil=True)
def control_at(address):
    return carray(address_as_pointer(address), (CONTROL_SIZE,), np.int64)


@njit(cache=True, nogil=True)
def publish(control, entry):
    """Make the job whose arguments were written visible to the workers (the generation becomes even)."""
    control[CLAIM] = 0
    control[INSIDE] = 0
    control[ENTRY] = entry
    atomic_add(control, GEN, 1)


@njit(cache=True, nogil=True)
def close_job(control):
    """Close the job (the generation becomes odd) and wait for the workers still in it."""
    atomic_add(control, GEN, 1)
    wait_zero(control, ACTIVE)


@njit(cache=True, nogil=True)
def serve(control, me, spin_ns):
    """A worker's loop: run the fast-path jobs as they are published; return IDLE after spin_ns without one,
    LEFT when asked to leave (control[EXIT + me]: a job for the general path, or shutdown)."""
    # a job already open when the worker comes (woken for it, or back from a general-path job) is joined too: one
    # longer than SPIN_SECONDS would otherwise see the worker wait it out, go back to sleep, and miss the next
    last = atomic_get(control, GEN) | 1
    idle_since = monotonic_ns()
    spins = 0
    while True:
        if atomic_get(control, EXIT + me) != 0:
            return LEFT
        g = atomic_get(control, GEN)
        if g != last and g % 2 == 0:
            last = g
            atomic_add(control, ACTIVE, 1)
            if atomic_get(control, GEN) == g:
                call_entry(control[ENTRY], control)
            atomic_add(control, ACTIVE, -1)
            idle_since = monotonic_ns()
            continue
        cpu_relax()
        spins += 1
        if spins % 64 == 0 and monotonic_ns() - idle_since > spin_ns:
            return IDLE


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


_WAKE = object()


class Workers:
    """n_threads - 1 worker threads beside the caller. run(kernel, n_tasks, *args): kernel(*args, counter) in the
    caller and the workers (general path); post(job, *args): the fast path (module docstring)."""

    def __init__(self, n_threads: int | None = None):
        self._inboxes = []      # first: __del__ closes a refused pool too
        if n_threads and n_threads > MAX_THREADS:
            raise ValueError(f"{n_threads} threads: the workers take at most {MAX_THREADS}")
        self.n_threads = max(1, n_threads or min(default_threads(), MAX_THREADS))
        self.control = np.zeros(CONTROL_SIZE, np.int64)
        self.control[GEN] = 1
        self._asleep = [True] * (self.n_threads - 1)
        for me in range(self.n_threads - 1):
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(me, inbox), daemon=True).start()
            self._inboxes.append(inbox)

    def _serve(self, me, inbox):
        control, spin_ns = self.control, int(SPIN_SECONDS * 1e9)
        while True:
            job = inbox.get()
            while True:
                if job is None:
                    return
                control[EXIT + me] = 0
                if job is not _WAKE:
                    kernel, args = job
                    kernel(*args)
                self._asleep[me] = False
                if serve(control, me, spin_ns) == IDLE:
                    self._asleep[me] = True
                    break
                control[EXIT + me] = 0
                job = inbox.get()

    def wake(self) -> None:
        """Wake the workers that went to sleep (a job posted meanwhile starts without them; they join it on arrival)."""
        for me, asleep in enumerate(self._asleep):
            if asleep:
                self._asleep[me] = False
                self._inboxes[me].put(_WAKE)

    def run(self, kernel, n_tasks: int, *args) -> None:
        counter = np.zeros(2, np.int64)
        helpers = range(max(0, min(self.n_threads, n_tasks) - 1))
        for me in helpers:
            self.control[EXIT + me] = 1
            self._inboxes[me].put((kernel, args + (counter,)))
        kernel(*args, counter)
        if helpers:
            wait_idle(counter)

    def post(self, job, *args) -> None:
        if True in self._asleep:
            self.wake()
        job.post(self.control, job.entry, *args)

    def close(self) -> None:
        for me, inbox in enumerate(self._inboxes):
            self.control[EXIT + me] = 1
            inbox.put(None)
        self._inboxes = []
        self.n_threads = 1

    def __del__(self):
        self.close()


class Job:
    """A kernel on the fast path: kernel(*args, counter) for one thread; post(control, entry, *args) (numba)
    writes args, publishes, runs the caller's share and closes; entry: the address of the C function the
    workers call (a cfunc reading the args back)."""

    def __init__(self, kernel, post, entry):
        self.kernel, self.post, self.entry = kernel, post, entry.address


_pool: Workers | None = None

# below this many multiply-adds a job runs in the calling thread alone. General path: waking a worker was
# measured at tens of µs on a VM (a one-row 576 x 3072 matmul took as long on two threads as on one). Fast path:
# a polling worker joins within a microsecond, but from Python a split matmul also took a one-token step off its
# one-call path: at 2^16 the tiny qwen3moe Q8_0 target's 2-thread step took 1.7-2.4x its 1-thread time, at 2^18
# the same time. Inside a one-call path (matmul.plan_rows posts from numba) 2^16 measured best: the tiny targets'
# 2-thread steps 8-16 % faster than at 2^18, 2^14-2^15 no better
MATMUL_MIN_WORK = 1 << 18
ATTENTION_MIN_WORK = 1 << 18
ONE_CALL_MIN_WORK = 1 << 16     # inside a one-call path (matmul.plan_rows; decided at load)


def one_call_counter() -> np.ndarray:
    """The counter of a one-call path (numba code that runs a piece's kernels one after the other, restarting the
    counter between them): the pool's control array where there are workers, awake, so that matmul.plan_rows can
    post the plans worth splitting to them; else a fresh two-slot counter."""
    workers = pool()
    if workers.n_threads == 1:
        return np.zeros(2, np.int64)
    workers.wake()
    return workers.control


def run(kernel, n_tasks: int, work: int, min_work: int, *args) -> None:
    """kernel(*args, counter) over n_tasks tasks (general path): on the workers, or in this thread alone when
    `work` (multiply-adds) is under min_work."""
    if work >= min_work and n_tasks > 1:
        pool().run(kernel, n_tasks, *args)
    else:
        kernel(*args, np.zeros(2, np.int64))


def in_caller(n_tasks: int, work: int, min_work: int) -> bool:
    """Whether run_job runs a job of n_tasks tasks and `work` multiply-adds in the calling thread alone."""
    return work < min_work or n_tasks <= 1 or pool().n_threads <= 1


def run_job(job: Job, n_tasks: int, work: int, min_work: int, *args) -> None:
    """The same on the fast path (args: C-contiguous arrays and integers, as job.post takes them)."""
    if in_caller(n_tasks, work, min_work):
        job.kernel(*args, np.zeros(2, np.int64))
    else:
        pool().post(job, *args)


def run_any(job: Job, n_tasks: int, work: int, min_work: int, *args) -> None:
    """run_job where every array among args is C-contiguous (as the fast path takes them), else run (general path)."""
    if all(a.flags.c_contiguous for a in args if isinstance(a, np.ndarray)):
        run_job(job, n_tasks, work, min_work, *args)
    else:
        run(job.kernel, n_tasks, work, min_work, *args)


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
