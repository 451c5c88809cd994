"""Run a Plan over many shards: parallel processes, a resume manifest, disk preflight, progress bars.

Each finished, verified shard is recorded in the manifest (`<prefix>.ggtools.json`, manifest.py) by
the process that wrote it, the moment it is renamed into place; so an interrupt, a killed run or several
`--shard K` runs at once never lose a finished shard. --resume skips a shard only when its entry still
matches (the output is re-hashed), and redoes every other one. Workers are -j processes (capped at the number
of shards), each writing one shard after another, the costliest shards first; one killed fails its shard only
(another takes its place); on an interrupt they are stopped, and each removes its temporary file. A run may also
keep no manifest (patch: nothing to resume), and a plan may copy a shard whole (ShardPlan.verbatim: a shard a patch
leaves alone).
"""

import multiprocessing
import os
import queue as queues
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from ggtools.engine import manifest
from ggtools.engine.errors import DiskSpaceError, EngineError, Interrupted, ShardFailed
from ggtools.engine.manifest import ShardResult, describe_output, source_identity
from ggtools.engine.rewrite import copy_shard, rewrite_shard
from ggtools.errors import GGToolsError
from ggtools.gguf.outputs import check_output, make_dir, remove_stale_temps
from ggtools.plan import COPY, Plan, ShardPlan

HEADER_ALLOWANCE = 1 << 20      # disk preflight: room for each output's header
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
STOP_WAIT = 10                  # seconds a stopped worker gets to remove its temporary file
PROGRESS_EVERY = 0.2            # seconds between a worker's progress messages
COPY_RATE = 1e9                 # shard_cost: bytes a worker copies (read, hash, write) per second, roughly
CONVERSION_COST = 20            # ... and how many times longer a byte converted takes


@dataclass
class RunReport:
    done: list[str]
    skipped: list[str]
    manifest: str | None            # None: a run that keeps no manifest
    nonfinite: dict[str, dict[str, int]] = field(default_factory=dict)   # output -> tensor -> NaN/inf count


@dataclass
class ShardJob:
    """What a worker needs besides the shard plan (picklable)."""
    manifest: str | None
    inputs: list[str]
    verify: bool
    allow_nonfinite: bool
    replace: bool = True            # an output that appeared after the start may be replaced (--force, --resume)
    threads: int = 1                # cores the run's conversions may use, all workers together


def cores() -> int:
    """The CPUs this process may run on (its affinity: taskset, a container's cpuset), else the CPU count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(jobs: int | None, n_shards: int) -> int:
    """-j capped at the number of shards; when not given, one per core (a worker overlaps its own reads, writes and
    conversions on threads of its own; on 2 cores a 4-shard set took 20 % longer with 4 workers than with 2)."""
    return max(1, min(jobs or cores(), n_shards))


def run_plan(plan: Plan, *, jobs=None, resume=False, force=False, verify=True, allow_nonfinite=False,
             progress=None, resumable=True, make_dirs=False, record=True, threads=None) -> RunReport:
    """Write every shard of the plan (with resume, those not finished yet). jobs: shards in parallel processes
    (None: worker_count's default); threads: the cores the conversions may use, shared among the workers
    running at any moment (None: every core the process may run on); resumable: whether the command offers --resume (what the messages
    suggest); make_dirs: make missing output directories (removed again if the run fails before writing
    into them); record: keep the resume manifest (without one nothing can be resumed, so a serial run
    stops at the first failed shard)."""
    job = ShardJob(manifest.path_for(plan) if record else None, list(plan.inputs), verify, allow_nonfinite,
                   replace=force or resume, threads=threads or cores())
    entries = manifest.read_entries(job.manifest) if record else {}
    todo, skipped = [], []
    for shard in plan.shards:
        if resume and manifest.still_valid(entries, plan.shard_fingerprint(shard), shard):
            skipped.append(shard.dst)
        else:
            todo.append(shard)
    _refuse_existing(todo, force or resume, resumable)
    preflight_disk(todo)
    made = _make_dirs(todo) if make_dirs else []
    report = RunReport([], skipped, job.manifest)
    try:
        for shard in todo:
            check_output(shard.dst, job.inputs, force=True)
        if record:
            check_output(job.manifest, job.inputs, force=True)
        _execute(plan, todo, worker_count(jobs, len(todo)), job, Progress(todo, progress), report)
    except KeyboardInterrupt:
        _remove_empty(made)
        if not record:
            raise
        raise _interrupted(plan, job, resumable) from None
    except BaseException:
        _remove_empty(made)
        raise
    return report


def _refuse_existing(todo, replace, resumable):
    for shard in todo:
        if os.path.lexists(shard.dst) and not replace:
            raise EngineError(f"{shard.dst}: output exists; pass --force to overwrite it"
                              + (", or --resume to continue the run that wrote it" if resumable else ""))


def _make_dirs(todo) -> list[str]:
    """Make the output directories that do not exist yet; returns them, outermost first."""
    made = []
    for d in dict.fromkeys(os.path.dirname(os.path.abspath(s.dst)) for s in todo):
        missing = []
        while not os.path.isdir(d) and os.path.dirname(d) != d:
            missing.append(d)
            d = os.path.dirname(d)
        for m in reversed(missing):
            make_dir(m)
            made.append(m)
    return made


def _remove_empty(dirs):
    for d in reversed(dirs):
        try:
            os.rmdir(d)
        except OSError:
            pass


def _interrupted(plan, job, resumable) -> Interrupted:
    try:
        recorded = manifest.read_entries(job.manifest)
    except GGToolsError:
        recorded = {}
    n = sum(os.path.basename(s.dst) in recorded for s in plan.shards)
    then = "rerun with --resume to do the rest" if resumable else "rerun to do the rest"
    return Interrupted(f"interrupted: {n} of {len(plan.shards)} shard(s) are finished and recorded in "
                       f"{job.manifest}; no other output was left behind; {then}")


def _execute(plan, todo, jobs, job, bars, report):
    errors = []

    def finished(shard, result: ShardResult):
        report.done.append(shard.dst)
        if result.nonfinite:
            report.nonfinite[shard.dst] = result.nonfinite

    fingerprints = [plan.shard_fingerprint(s) for s in todo]
    try:
        if jobs == 1:
            for i, shard in enumerate(todo):
                try:
                    finished(shard, run_shard(shard, fingerprints[i], job, bars.callback(i), lambda: job.threads))
                except GGToolsError as e:
                    if not job.manifest:
                        raise
                    errors.append((shard, e))
        else:
            _parallel(todo, fingerprints, jobs, job, bars, finished, errors)
    finally:
        bars.close()
    if len(errors) == 1:
        raise errors[0][1]
    if errors:
        raise ShardFailed("; ".join(f"{os.path.basename(s.dst)}: {e}" for s, e in errors),
                          max(e.exit_code for _, e in errors))


def run_shard(shard: ShardPlan, fingerprint: str, job: ShardJob, on_bytes, threads) -> ShardResult:
    """Write one shard (rewritten, or copied whole when verbatim) and record it in the manifest; threads(): the
    cores its conversions may use now."""
    source = source_identity(shard.src) if job.manifest else None
    if shard.verbatim:
        result = copy_shard(shard, force=job.replace, inputs=job.inputs)
        on_bytes(shard.bytes_in)
    else:
        result = rewrite_shard(shard, force=job.replace, verify=job.verify, inputs=job.inputs,
                               allow_nonfinite=job.allow_nonfinite, on_bytes=on_bytes, threads=threads)
    if job.manifest:
        described = result if result.digest else describe_output(shard.dst)
        manifest.record(job.manifest, os.path.basename(shard.dst), manifest.entry(fingerprint, source, described),
                        job.inputs)
    return result


def _parallel(todo, fingerprints, jobs, job, bars, finished, errors):
    """`jobs` worker processes, each taking one shard after another, the costliest first (a worker loads its kernels
    once, and no long shard is left to run alone at the end); messages come back on one queue."""
    ctx = multiprocessing.get_context("fork" if _fork_is_safe() else "spawn")
    messages = ctx.Queue()
    n_running = ctx.Value("i", 0, lock=False)     # read by the workers: a worker alone converts on every core
    waiting = sorted(range(len(todo)), key=lambda i: -shard_cost(todo[i]))
    workers: list[_Worker] = []
    retired = []                                  # processes told to stop, joined at the end

    def give_work(worker):
        """The next shard to the worker, or the order to stop (then it leaves the list)."""
        worker.shard = waiting.pop(0) if waiting else None
        worker.tasks.put(worker.shard)
        if worker.shard is None:
            retire(worker)
        n_running.value = sum(w.shard is not None for w in workers)

    def retire(worker):
        retired.append(worker.process)
        workers.remove(worker)

    def handle(kind, i, payload):
        if kind == "bytes":
            bars.update(i, payload)
            return
        if kind == "done":
            finished(todo[i], ShardResult(**payload))
        else:
            errors.append((todo[i], ShardFailed(*payload)))
        worker = next((w for w in workers if w.shard == i), None)
        if worker is None:
            return
        if kind == "error" and payload[1] == Interrupted.exit_code:     # the worker stops
            worker.shard = None
            retire(worker)
        else:
            give_work(worker)

    def reap():
        """Workers that died without a word (killed): their shards failed, others started in their place."""
        for worker in _dead(workers, messages, handle):
            if worker.shard is not None:
                errors.append((todo[worker.shard], ShardFailed(_death(worker.process.exitcode), 1)))
            workers.remove(worker)
            if waiting:
                workers.append(_Worker(ctx, messages, todo, fingerprints, job, n_running))
                give_work(workers[-1])

    try:
        for _ in range(min(jobs, len(todo))):
            workers.append(_Worker(ctx, messages, todo, fingerprints, job, n_running))
            give_work(workers[-1])
        while workers:
            try:
                handle(*messages.get(timeout=1))
            except queues.Empty:
                reap()
        for process in retired:
            process.join()
    except BaseException:
        _stop([w.process for w in workers] + retired)
        leftovers = [todo[w.shard].dst for w in workers if w.shard is not None]
        for path in leftovers + ([job.manifest] if job.manifest else []):
            remove_stale_temps(path)        # what a worker stopped at the wrong moment (or killed) could not remove
        raise


class _Worker:
    """A worker process, the queue it takes shard indices from (None: stop), and the shard it works on."""

    def __init__(self, ctx, messages, todo, fingerprints, job, n_running):
        self.shard = None
        self.tasks = ctx.SimpleQueue()
        self.process = ctx.Process(target=_worker, args=(messages, self.tasks, todo, fingerprints, job, n_running),
                                   daemon=True)
        _start_holding_signals(self.process)


def shard_cost(shard: ShardPlan) -> float:
    """A shard's work in seconds on one core, roughly: its bytes read and written, and its bytes converted (a
    conversion costs about 20 times a copy of the same bytes)."""
    converted = sum(a.bytes_in for a in shard.tensors if a.action != COPY)
    return (shard.bytes_in + CONVERSION_COST * converted) / COPY_RATE


def _death(code) -> str:
    return f"the worker process died ({f'signal {-code}' if code < 0 else f'exit {code}'}) before finishing this shard"


def _dead(workers, messages, handle) -> list:
    """The workers that died without a word (killed), after what they did send was handled."""
    dead = [w for w in workers if w.process.exitcode is not None]
    if dead:
        try:
            while True:
                handle(*messages.get_nowait())
        except queues.Empty:
            pass
    return [w for w in dead if w in workers]


def _stop(processes):
    """Stop workers (SIGTERM: each removes its temporary file), then make sure they are gone."""
    processes = [p for p in processes if p.is_alive()]
    for p in processes:
        p.terminate()
    for p in processes:
        p.join(STOP_WAIT)
        if p.is_alive():
            p.kill()
            p.join()


def _start_holding_signals(process):
    """Start a worker with ^C and SIGTERM held (it inherits the signal mask) until it has its own handlers:
    one arriving before would end it with a traceback."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _worker(messages, tasks, todo, fingerprints, job, n_running):
    """Shards from tasks (indices into todo) until None, or an interrupt."""
    global _worker_stopping
    for s in STOP_SIGNALS:
        signal.signal(s, _interrupt)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)     # one held since the start arrives now
        while (index := tasks.get()) is not None:
            if not _worker_shard(messages, index, todo[index], fingerprints[index], job, n_running):
                break
    except KeyboardInterrupt:
        pass
    finally:
        _worker_stopping = True     # a signal while the process exits must not raise (a traceback from its exit)


def _worker_shard(messages, index, shard, fingerprint, job, n_running) -> bool:
    """Write one shard, its result or failure sent back; False when interrupted."""
    try:
        progress = _Coalesced(lambda n: messages.put(("bytes", index, n)))
        result = run_shard(shard, fingerprint, job, progress,
                           lambda: max(1, job.threads // max(1, n_running.value)))
        progress.flush()
        messages.put(("done", index, asdict(result)))
    except GGToolsError as e:
        messages.put(("error", index, (str(e), e.exit_code)))
    except KeyboardInterrupt:
        messages.put(("error", index, ("the worker was interrupted", Interrupted.exit_code)))
        return False
    except BaseException as e:     # a bug: say where, in one message
        where = traceback.extract_tb(e.__traceback__)[-1]
        messages.put(("error", index, (f"internal error: {type(e).__name__}: {e} (at {os.path.basename(where.filename)}"
                                       f":{where.lineno})", 2)))
    return True


_worker_stopping = False


class _Coalesced:
    """A worker's progress, sent to the parent at most every PROGRESS_EVERY seconds (not once per chunk read:
    each message is pickled and sent through a pipe); thread-safe, as the rewrite's threads all report."""

    def __init__(self, send):
        self.send, self.pending, self.last = send, 0, time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, n):
        with self.lock:
            self.pending += n
            if time.monotonic() - self.last >= PROGRESS_EVERY:
                self._send()

    def flush(self):
        with self.lock:
            self._send()

    def _send(self):
        if self.pending:
            self.send(self.pending)
        self.pending, self.last = 0, time.monotonic()


def _interrupt(signum, frame):
    """Interrupt a worker once (^C, then the parent's SIGTERM, must not cut short the removal of its
    temporary file)."""
    global _worker_stopping
    if not _worker_stopping:
        _worker_stopping = True
        raise KeyboardInterrupt


def _fork_is_safe() -> bool:
    """A forked worker starts at once, with everything imported (a spawned one re-imports numba and reloads
    every kernel: over a second of CPU each); but OpenMP threads do not survive fork(), so fork only while
    this process has not started numba's thread pool."""
    from numba.np.ufunc import parallel
    return sys.platform.startswith("linux") and not getattr(parallel, "_is_initialized", True)


def _existing_ancestor(path):
    """path, or its nearest existing parent (where a directory still to be made would live)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def preflight_disk(todo: list[ShardPlan]):
    """Refuse to start when the outputs cannot fit (space freed by outputs being replaced counts)."""
    by_dir = {}
    for s in todo:
        d = os.path.dirname(os.path.abspath(s.dst))
        replaced = os.path.getsize(s.dst) if os.path.isfile(s.dst) else 0
        by_dir[d] = by_dir.get(d, 0) + s.bytes_out + HEADER_ALLOWANCE - replaced
    for d, need in by_dir.items():
        free = shutil.disk_usage(_existing_ancestor(d)).free
        if need > free:
            raise DiskSpaceError(d, need, free)


class Progress:
    """An overall bar plus one per shard (bytes of input processed), shown on a terminal unless disabled."""

    def __init__(self, todo, enabled):
        self.disable = (not _is_tty()) if enabled is None else not enabled
        total = sum(s.bytes_in for s in todo)
        self.overall = tqdm(total=total, unit="B", unit_scale=True, desc="total", disable=self.disable,
                            position=0, dynamic_ncols=True)
        self.shards = [tqdm(total=s.bytes_in, unit="B", unit_scale=True, desc=os.path.basename(s.dst),
                            disable=self.disable or len(todo) < 2, position=i + 1, leave=False,
                            dynamic_ncols=True) for i, s in enumerate(todo)]

    def callback(self, index):
        return lambda n: self.update(index, n)

    def update(self, index, n):
        self.shards[index].update(n)
        self.overall.update(n)

    def close(self):
        for bar in self.shards + [self.overall]:
            bar.close()


def _is_tty():
    return sys.stderr.isatty()
