#!/usr/bin/env python3
"""Benchmark `ggtools validate --deep` against reading the same bytes with `cat > /dev/null`, page cache cold and
warm (goal: at least the speed of cat), on a generated Kimi-like shard set and on gemma3-270m:

- whole process, as a user waits: `ggtools validate --deep FILES` against `cat FILES > /dev/null`;
- the scan alone, in this process: validate's deep scan (read ahead on one thread, the checks on another) against
  reading the files with large reads into one buffer;
- at scale: both commands less their time on a small set of the same shape (what start-up costs taken off);
- the bytes validate read (system calls, and from the disk when cold) against the files' size.

  python -m scripts.bench.validate [--gb 2] [--dir D] [--repeat 5] [--keep] [--markdown [PAGE]]

Cold: drop_caches as root, else posix_fadvise DONTNEED on the files (the report says which).
"""

import argparse
import os
import shutil
import subprocess
import sys

from ggtools.gguf import GGUFFile
from ggtools.jobs.validate import deep_scan
from scripts.bench import page
from scripts.bench.diskio import (CACHES, Run, best_seconds, cold_method, ggtools_cmd, gguf_or_gemma, in_turn,
                                  read_files, set_cache)
from scripts.bench.moe_sets import kimi_like_set, small_set


def scan_all(paths):
    for p in paths:
        with GGUFFile(p) as f:
            deep_scan(f)


def measure(name, paths, repeat, report):
    """{(cache, what): best seconds} and the cold validate run (its bytes). Warm: the files and the command's own
    (Python, its libraries, cat) in the page cache, so a cold round's drop_caches does not weigh on the next warm
    round: each command runs once untimed first."""
    size = sum(os.path.getsize(p) for p in paths)
    scan_all(paths)                             # this process's modules loaded
    commands = {"cat": ["sh", "-c", 'cat "$@" > /dev/null', "cat", *paths],
                "validate": ggtools_cmd("validate", "--deep", *paths)}
    best, cold_run = {}, None
    for r in range(repeat):
        for cache in CACHES:
            for what in in_turn(["cat", "validate", "read", "scan"], r):
                if cache == "warm" and what in commands:
                    Run(commands[what])
                set_cache(cache, paths)
                if what == "cat":
                    seconds = Run(commands["cat"]).seconds
                elif what == "validate":
                    run = Run(commands["validate"])
                    seconds = run.seconds
                    if cache == "cold" and (cold_run is None or seconds < cold_run.seconds):
                        cold_run = run
                elif what == "read":
                    seconds = best_seconds(lambda: read_files(paths))
                else:
                    seconds = best_seconds(lambda: scan_all(paths))
                best[(cache, what)] = min(best.get((cache, what), float("inf")), seconds)
                print(f"  {name} round {r + 1}: {cache} {what:8} {seconds:6.3f} s ({size / seconds / 1e9:.2f} GB/s)",
                      file=report)
    return size, best, cold_run


def at_scale_rows(name, big, small):
    """validate --deep against cat on what the big set's bytes cost beyond start-up: each command's time on the big
    set less its time on the small one (size, best) of the same shape."""
    (size, best), (small_size, small_best) = big, small
    gb = (size - small_size) / 1e9
    out = []
    for cache in CACHES:
        ours, cat = ((best[(cache, what)] - small_best[(cache, what)]) for what in ("validate", "cat"))
        out.append([name, cache, "at scale: whole process less the small set's", f"{gb / ours:.2f} GB/s",
                    f"{gb / cat:.2f} GB/s", f"**{cat / ours:.2f}**", ">= 1"])
    return out


def rows(name, size, best):
    out = []
    for cache in CACHES:
        ours, cat = best[(cache, "validate")], best[(cache, "cat")]
        out.append([name, cache, "whole process: `validate --deep` / `cat`", f"{size / ours / 1e9:.2f} GB/s",
                    f"{size / cat / 1e9:.2f} GB/s", f"**{cat / ours:.2f}**", ">= 1"])
        scan, read = best[(cache, "scan")], best[(cache, "read")]
        out.append([name, cache, "in-process: deep scan / large reads", f"{size / scan / 1e9:.2f} GB/s",
                    f"{size / read / 1e9:.2f} GB/s", f"{read / scan:.2f}", ">= 1"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--dir", default="/tmp/ggtools-bench-validate")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the generated set")
    page.add_option(ap)
    args = ap.parse_args()
    report = sys.stderr if page.prints_markdown(args) else sys.stdout
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    kimi = kimi_like_set(os.path.join(args.dir, "kimi-like"), args.gb, 4)
    small = small_set(os.path.join(args.dir, "small"), 4)
    gemma = [gguf_or_gemma()]
    subprocess.run(["sync"], check=True)
    loads = [os.getloadavg()[0]]
    kimi_name = f"Kimi-like set, {len(kimi)} shards"
    table, results = [], {}
    for name, paths in ((kimi_name, kimi), ("gemma-3-270m-q4_k_m", gemma), ("small", small)):
        results[name] = measure(name, paths, args.repeat, report)
        size, best, _ = results[name]
        if name != "small":
            table += rows(f"{name}, {size / 1e9:.2f} GB", size, best)
        loads.append(os.getloadavg()[0])
    (size, best, run), (small_size, small_best, _) = results[kimi_name], results["small"]
    table += at_scale_rows(f"{kimi_name}, {size / 1e9:.2f} GB", (size, best), (small_size, small_best))
    io = run.io or {}
    bytes_line = (f"`validate --deep` on the Kimi-like set, cold: read {io.get('rchar', 0) / size:.3f}x the files' "
                  f"size through system calls, {run.disk_in / size:.3f}x from the disk.")
    body = (f"Best of {args.repeat} rounds, each command in turn; cold: {cold_method()}; load average "
            f"{min(loads):.2f}-{max(loads):.2f} during the runs. Ratio: cat's time (or the large reads') over ours. At "
            f"scale: the same commands on a small set of the same shape ({len(small)} shards, "
            f"{small_size / 1e9:.3f} GB) taken off, leaving what the set's bytes cost beyond start-up, as on a set of "
            f"hundreds of GB.\n\n"
            + page.table(["files", "page cache", "measure", "ours", "reference", "ratio", "goal"], table)
            + "\n\n" + bytes_line)
    page.publish(args, "validate", body)
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
