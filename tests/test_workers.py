"""The workers' fast path (workers.run_job): jobs handed to polling worker threads through the control array give
the bits of one thread, job after job (no worker may run a job with another job's arguments), whether the workers
poll, were asleep, or are woken mid-burst; and a worker's share really is done by the worker."""

import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit

from ggtools.runtime.kernels import matmul, workers
from tests.test_runtime_kernels import make_weights

TYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.MXFP4, T.F16, T.Q4_K]


@pytest.fixture
def threads():
    yield workers.set_threads
    workers.set_threads(workers.default_threads())


def matmuls(seed, count=300):
    """Random matmul cases (matrix types, shapes, batch sizes) that the workers split (over MATMUL_MIN_WORK)."""
    rng = np.random.default_rng(seed)
    weights = {t: make_weights(t, n_rows=1024, n_cols=512, seed=i)[0] for i, t in enumerate(TYPES)}
    cases = []
    for _ in range(count):
        qtype = TYPES[rng.integers(len(TYPES))]
        n_rows = int(rng.choice([512, 1024]))
        x = rng.standard_normal((int(rng.integers(1, 9)), 512)).astype(np.float32)
        cases.append((qtype, n_rows, weights[qtype], x))
    assert all(len(x) * n_rows * 512 >= workers.MATMUL_MIN_WORK for _, n_rows, _, x in cases)
    return cases


def run_all(cases, pause=0.0):
    out = []
    for qtype, n_rows, data, x in cases:
        layout = matmul.Layout(qtype, n_rows, 512)
        out.append(matmul.matmul(layout, data, matmul.PreparedInput(x, layout.activation)))
        if pause:
            time.sleep(pause)
    return out


def same_bits(want, got):
    return all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(want, got))


def test_fast_path_jobs_give_one_threads_bits_job_after_job(threads):
    cases = matmuls(0)
    threads(1)
    want = run_all(cases)
    for n in (2, 3, 4):
        threads(n)
        got = run_all(cases)
        assert same_bits(want, got), n


def test_sleeping_workers_are_woken_and_change_no_bit(threads, monkeypatch):
    """Workers that sleep between jobs (a pause longer than their polling time) are woken by the next job; the
    job runs right whether or not they join it in time."""
    cases = matmuls(1, count=40)
    threads(1)
    want = run_all(cases)
    monkeypatch.setattr(workers, "SPIN_SECONDS", 20e-6)
    threads(3)
    got = run_all(cases, pause=2e-3)
    assert same_bits(want, got)


def test_polling_workers_take_tasks(threads):
    """A worker joins fast-path jobs: after a job the claim counter stands at the task count plus one final claim
    per thread that ran the job's claim loop, so n_tasks + 2 when the worker took part (the caller alone: + 1).
    Jobs are repeated until that is seen (a loaded machine may not run the worker for a while)."""
    pool = threads(2)
    data, _ = make_weights(T.Q8_0, n_rows=4096, n_cols=512)
    layout = matmul.Layout(T.Q8_0, 4096, 512)
    x = matmul.PreparedInput(np.ones((1, 512), np.float32), layout.activation)
    plan = matmul.MatmulPlan([layout], data, [0])
    n_tasks, seen = len(plan.thread_tasks(2)), set()
    for _ in range(5000):
        plan.run(x)
        seen.add(int(pool.control[workers.CLAIM]))
        if n_tasks + 2 in seen:
            break
    assert n_tasks + 2 in seen and seen <= {n_tasks + 1, n_tasks + 2}, seen


def test_a_woken_worker_joins_the_job_that_woke_it(threads):
    """A job posted while the worker sleeps starts without it; the worker, once awake, joins that job if it is still
    open (it used to wait for the next one, and a job longer than its polling time never saw it). Each try is a
    fresh pool, its worker asleep, and one long job (a 16-row batch of a 4096 x 512 matmul); the claim counter
    ends at the task count + 2 when both threads ran the claim loop. Tries are repeated until that is seen (a loaded
    machine may not run the worker before the job ends)."""
    data, _ = make_weights(T.Q8_0, n_rows=4096, n_cols=512)
    layout = matmul.Layout(T.Q8_0, 4096, 512)
    x = matmul.PreparedInput(np.ones((16, 512), np.float32), layout.activation)
    seen = set()
    for _ in range(20):
        workers.set_threads(1)
        pool = threads(2)
        plan = matmul.MatmulPlan([layout], data, [0])
        plan.run(x)
        seen.add(int(pool.control[workers.CLAIM]) - len(plan.thread_tasks(2)))
        if 2 in seen:
            break
    assert 2 in seen, seen


@pytest.mark.parametrize("n_threads", [1, 2, 3, 16, 32, 112])
def test_tasks_cover_each_row_once_in_long_runs(n_threads):
    """A plan's tasks: every weight row of every matrix exactly once, at its byte offset and output column; within
    a matrix all tasks but the last take the same number of rows r, a multiple of 8 (the repacked kernels take 8
    rows at a time) from MIN_ROWS_PER_TASK to MAX_ROWS_PER_TASK; above MIN_ROWS_PER_TASK, at least
    TASKS_PER_THREAD rounds of claims that the tasks fill: the most rows a thread takes (ceil(tasks / threads)
    tasks of r) are over an equal share by less than 8 per task."""
    layouts = [matmul.Layout(T.Q8_0, n, 64) for n in (576, 192, 3072, 40, 5120, 17408, 151936)]
    offsets = np.cumsum([0] + [l.n_rows * int(l.row_bytes) for l in layouts])
    plan = matmul.MatmulPlan(layouts, np.zeros(offsets[-1], np.uint8), list(offsets[:-1]))
    tasks = plan.thread_tasks(n_threads)
    covered = np.zeros(plan.n_rows, np.int64)
    for m, (lo, hi) in enumerate(plan.columns):
        mine = [t for t in tasks if lo <= t[2] < hi]
        for offset, rows, column, _ in mine:
            covered[column:column + rows] += 1
            assert offset == offsets[m] + (column - lo) * int(layouts[m].row_bytes)
        r = {rows for _, rows, _, _ in mine[:-1]} or {mine[0][1]}
        assert len(r) == 1, r
        r = r.pop()
        assert r % 8 == 0 or len(mine) == 1
        assert r <= matmul.MAX_ROWS_PER_TASK and (r >= matmul.MIN_ROWS_PER_TASK or len(mine) == 1)
        if r > matmul.MIN_ROWS_PER_TASK:
            rounds = -(-len(mine) // n_threads)
            assert rounds >= matmul.TASKS_PER_THREAD, (hi - lo, r)
            assert rounds * r - (hi - lo) / n_threads < 8 * rounds, (hi - lo, r, len(mine))
    assert (covered == 1).all()


@njit(nogil=True)
def count_tasks(out, counter):
    """A general-path kernel: out[k] += 1 for every task k it claims."""
    workers.enter(counter)
    while True:
        k = workers.claim(counter)
        if k >= out.size:
            break
        out[k] += 1
    workers.leave(counter)


def test_more_threads_than_the_control_array_once_held(threads):
    """A pool past the old cap of 40 threads (a 41st worker's flag was the job's entry slot) runs fast-path jobs with
    the bits of one thread and general-path jobs on every thread, each task once; past MAX_THREADS it is refused,
    not silently cut."""
    cases = matmuls(2, count=6)
    threads(1)
    want = run_all(cases)
    assert threads(48).n_threads == 48
    got = run_all(cases)
    assert same_bits(want, got)
    out = np.zeros(4096, np.int64)
    workers.run(count_tasks, out.size, 1, 0, out)
    assert (out == 1).all()
    with pytest.raises(ValueError, match="at most"):
        workers.Workers(workers.MAX_THREADS + 1)
