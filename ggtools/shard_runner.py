"""Run a Plan over many shards: parallel processes, a resume manifest, disk preflight, progress bars.

The manifest (`<prefix>.ggtools.json` beside the outputs) records each finished, verified shard: the plan
fingerprint, the source's identity and the output's size and sha256. --resume skips a shard only when all
of those still match (the output is re-hashed), and redoes every other one.
"""

import concurrent.futures as cf
import glob
import json
import multiprocessing
import os
import shutil
import sys
import threading
from dataclasses import asdict, dataclass

from tqdm import tqdm

from ggtools.errors import GGToolsError
from ggtools.engine import RewriteError, ShardResult, describe_output, rewrite_shard, source_identity
from ggtools.gguf import GGUFError, parse_shard_name
from ggtools.plan import Plan, ShardPlan


def manifest_path_for(plan: Plan) -> str:
    first = plan.shards[0].dst
    name = parse_shard_name(first)
    stem = name.prefix if name else os.path.splitext(first)[0]
    return f"{stem}.ggtools.json"


@dataclass
class RunReport:
    done: list[str]
    skipped: list[str]
    manifest: str


class Manifest:
    def __init__(self, path):
        self.path = path
        self.entries = {}
        if os.path.exists(path):
            try:
                with open(path) as fh:
                    self.entries = json.load(fh)["shards"]
            except (ValueError, KeyError, OSError):
                raise GGUFError(path, "unreadable manifest; delete it to start over") from None

    def save(self):
        tmp = f"{self.path}.partial-{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump({"format": "ggtools-rewrite/1", "shards": self.entries}, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def record(self, plan: Plan, shard: ShardPlan, result: ShardResult):
        self.entries[os.path.basename(shard.dst)] = {
            "fingerprint": plan.shard_fingerprint(shard), "source": source_identity(shard.src),
            "output": {"size": result.size, "digest": result.digest, "tensors": result.tensors},
            "verified": result.verified}

    def still_valid(self, plan: Plan, shard: ShardPlan) -> bool:
        e = self.entries.get(os.path.basename(shard.dst))
        if not e or e["fingerprint"] != plan.shard_fingerprint(shard) or not os.path.exists(shard.dst):
            return False
        if e["source"] != source_identity(shard.src) or os.path.getsize(shard.dst) != e["output"]["size"]:
            return False
        return describe_output(shard.dst).digest == e["output"]["digest"]


def run_plan(plan: Plan, *, jobs=1, resume=False, force=False, verify=True, progress=None) -> RunReport:
    manifest = Manifest(manifest_path_for(plan))
    todo, skipped = [], []
    for shard in plan.shards:
        if resume and manifest.still_valid(plan, shard):
            skipped.append(shard.dst)
        else:
            todo.append(shard)
    for shard in todo:
        _remove_stale_partials(shard.dst)
        if os.path.exists(shard.dst) and not (force or (resume and os.path.basename(shard.dst) in manifest.entries)):
            raise GGUFError(shard.dst, "output exists; pass --force to overwrite it (or --resume to continue a run)")
    preflight_disk(todo)
    for d in {os.path.dirname(os.path.abspath(s.dst)) for s in todo}:
        os.makedirs(d, exist_ok=True)
    bars = Progress(todo, progress)
    errors = []
    try:      # existing outputs were cleared for overwriting above
        for shard, result in _execute(todo, jobs, True, verify, bars, errors):
            manifest.record(plan, shard, result)
            manifest.save()
    finally:
        bars.close()
    if errors:
        raise RewriteError("; ".join(f"{os.path.basename(s.dst)}: {e}" for s, e in errors))
    return RunReport([s.dst for s in todo], skipped, manifest.path)


def _execute(todo, jobs, force, verify, bars, errors):
    if jobs <= 1 or len(todo) <= 1:
        for i, shard in enumerate(todo):
            try:
                yield shard, rewrite_shard(shard, force=force, verify=verify, on_bytes=bars.callback(i))
            except GGToolsError as e:
                errors.append((shard, e))
        return
    ctx = multiprocessing.get_context("fork" if _fork_is_safe() else "spawn")
    queue = ctx.Queue()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with cf.ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(threads, queue)) as pool:
        futures = {pool.submit(_worker, shard, i, force, verify): shard for i, shard in enumerate(todo)}
        drain = threading.Thread(target=bars.drain, args=(queue,), daemon=True)   # started after the forks
        drain.start()
        for fut in cf.as_completed(futures):
            shard = futures[fut]
            try:
                yield shard, ShardResult(**fut.result())
            except GGToolsError as e:
                errors.append((shard, e))
    queue.put(None)
    drain.join()


def _fork_is_safe() -> bool:
    """A forked worker starts at once, with everything imported (a spawned one re-imports numba and reloads
    every kernel: over a second of CPU each); but OpenMP threads do not survive fork(), so fork only while
    this process has not started numba's thread pool."""
    from numba.np.ufunc import parallel
    return sys.platform.startswith("linux") and not getattr(parallel, "_is_initialized", True)


_progress_queue = None


def _init_worker(threads, queue):
    global _progress_queue
    import numba
    numba.set_num_threads(threads)
    _progress_queue = queue


def _worker(shard, index, force, verify):
    result = rewrite_shard(shard, force=force, verify=verify, on_bytes=lambda n: _progress_queue.put((index, n)))
    return asdict(result)


def _remove_stale_partials(dst):
    directory, base = os.path.split(os.path.abspath(dst))
    for p in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(base)}.partial-*")):
        os.unlink(p)


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
        replaced = os.path.getsize(s.dst) if os.path.exists(s.dst) else 0
        by_dir[d] = by_dir.get(d, 0) + s.bytes_out + 1_000_000 - replaced     # ~1 MB header allowance
    for d, need in by_dir.items():
        free = shutil.disk_usage(_existing_ancestor(d)).free
        if need > free:
            raise GGUFError(d, f"not enough disk space: the output needs {need / 1e9:.2f} GB, "
                               f"{free / 1e9:.2f} GB are free")


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

    def drain(self, queue):
        while (item := queue.get()) is not None:
            self.update(*item)

    def close(self):
        for bar in self.shards + [self.overall]:
            bar.close()


def _is_tty():
    return sys.stderr.isatty()
