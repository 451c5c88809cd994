#!/usr/bin/env python3
"""Benchmark the start-up of the commands that run no model, whole process, as a user waits for them:

- `ggtools inspect FILE` against gguf-py's GGUFReader on the same file (`python -c "import gguf;
  gguf.GGUFReader(FILE)"`), goal: 50x faster;
- `ggtools --help` and `ggtools inspect FILE`, their own time (goal: under 0.15 s): the process's time less a bare
  `python -c pass`'s, and the imports' share of it (python -X importtime, everything below ggtools.cli and the
  command's module).

  python -m scripts.bench.startup [FILE] [--repeat 7] [--markdown [PAGE]]

FILE defaults to gemma3-270m Q4_K_M (a 262k-token vocabulary) from its package.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench import page
from scripts.bench.diskio import add_gguf_argument, gguf_or_gemma, load_average


def wall(cmd) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def best_of(repeat, commands: dict) -> dict:
    """Best wall seconds of each command, the commands run in turn."""
    best = dict.fromkeys(commands, float("inf"))
    for _ in range(repeat):
        for name, cmd in commands.items():
            best[name] = min(best[name], wall(cmd))
    return best


def import_seconds(args) -> float:
    """The imports' time (python -X importtime) of `ggtools ARGS`: the top-level imports the CLI made."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "ggtools", *args], capture_output=True, text=True)
    total = 0
    for line in run.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)     # cumulative, top level only
        if m and not m.group(2).startswith(" ") and m.group(2) not in ("site", "encodings", "runpy"):
            total += int(m.group(1))
    return total / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_gguf_argument(ap)
    ap.add_argument("--repeat", type=int, default=7)
    page.add_option(ap)
    args = ap.parse_args()
    path = gguf_or_gemma(args.path)
    py = sys.executable
    commands = {"bare": [py, "-c", "pass"],
                "help": [py, "-m", "ggtools", "--help"],
                "inspect": [py, "-m", "ggtools", "inspect", path],
                "gguf-py": [py, "-c", "import sys, gguf; gguf.GGUFReader(sys.argv[1])", path]}
    load_before = load_average()
    best = best_of(1, {"gguf-py": commands["gguf-py"]})       # gguf-py takes seconds: fewer rounds
    best.update(best_of(max(1, args.repeat // 3), {"gguf-py": commands["gguf-py"]}))
    rest = {k: v for k, v in commands.items() if k != "gguf-py"}
    best.update(best_of(args.repeat, rest))
    imports = {"help": min(import_seconds(["--help"]) for _ in range(3)),
               "inspect": min(import_seconds(["inspect", path]) for _ in range(3))}
    load = f"load average {load_before} before, {load_average()} after"
    bare = best["bare"]
    rows = [["`ggtools inspect` against gguf-py's GGUFReader, whole process", f"{best['inspect'] * 1e3:.0f} ms",
             f"{best['gguf-py'] * 1e3:.0f} ms", f"**{best['gguf-py'] / best['inspect']:.0f}x** faster", ">= 50x"]]
    for name, label in (("help", "`ggtools --help`"), ("inspect", "`ggtools inspect`")):
        rows.append([f"{label}, its own time (less a bare `python -c pass`, {bare * 1e3:.0f} ms)",
                     f"{(best[name] - bare) * 1e3:.0f} ms", "", f"imports {imports[name] * 1e3:.0f} ms",
                     "< 150 ms"])
    body = (f"{Path(path).name}, {os.path.getsize(path) / 1e6:.1f} MB; best of {args.repeat} runs of each command "
            f"in turn (gguf-py: of {1 + max(1, args.repeat // 3)}); {load}.\n\n"
            + page.table(["measure", "ours", "reference", "ratio", "goal"], rows))
    page.publish(args, "startup", body)


if __name__ == "__main__":
    main()
