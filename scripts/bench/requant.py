#!/usr/bin/env python3
"""Benchmark requant-trunk on a generated Kimi-like shard set (trunk about 7 % of the bytes), all in one run:

- wall time of `ggtools requant-trunk` (verification on, outputs fsync'ed) against `cp -r` of the same set followed by
  `sync` of the copies (goal: at most 1.1x on 2 CPUs), page cache cold and warm, on 1 and 2 CPUs (taskset); and
  at scale: both less their time on a small set of the same shape (what start-up costs taken off);
- the bytes requant-trunk read and wrote (system calls, and what reached the disk) against the set's size;
- the peak RSS of a worker process (goal: 300 MB), and the Q8_0 -> Q4_K conversion rate against ggml's C.

  python -m scripts.bench.requant [--gb 2] [--shards 4] [--dir D] [--cpus 1,2] [--repeat 2] [-j N] [--keep]
                                  [--markdown [PAGE]]

Cold: the page cache dropped before each command (drop_caches as root, else posix_fadvise DONTNEED on the set's
files; the report says which). Warm: the set read once right before. Each configuration runs the two commands in
turn, best of --repeat rounds.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from ggtools import quants
from scripts.bench import page
from scripts.bench.diskio import (CACHES, Run, best_seconds, cold_method, files_under, ggtools_cmd, in_turn,
                                  load_average, set_cache)
from scripts.bench.moe_sets import kimi_like_set, layers_for, small_set

def conversion_rates(mb=16):
    """Q8_0 -> Q4_K in MB of float32 values per second: ours on 1 thread and on all, ggml's C on 1 (or None)."""
    rows = int(mb * 1e6 / 4 / 4096)
    q8 = quants.quantize(T.Q8_0, np.random.default_rng(0).standard_normal((rows, 4096), dtype=np.float32) * 0.02)
    values = quants.dequantize(T.Q8_0, q8)
    quants.requantize(T.Q8_0, T.Q4_K, q8[:1])                       # JIT compile / cache load

    def ours(threads):
        numba.set_num_threads(threads)
        quants.requantize(T.Q8_0, T.Q4_K, q8[:64])      # the first launch after a thread-count change costs extra
        return values.nbytes / best_seconds(lambda: quants.requantize(T.Q8_0, T.Q4_K, q8), 3) / 1e6

    all_threads = numba.config.NUMBA_NUM_THREADS
    one, many = ours(1), ours(all_threads)
    numba.set_num_threads(all_threads)
    c = None
    try:
        from tests.ggml_oracle import load_ggml
        ggml = load_ggml()
        c = values.nbytes / best_seconds(lambda: ggml.quantize(T.Q4_K, quants.dequantize(T.Q8_0, q8)), 3) / 1e6
    except BaseException as e:        # pytest.skip is a BaseException
        print(f"(ggml C reference not available: {e})", file=sys.stderr)
    return one, many, all_threads, c


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["sync"], check=True)


def run_cp(src, dst, cpus):
    """`cp -r` of the set, then `sync` of the copies (what requant-trunk's fsync of each output does)."""
    copy = Run(["cp", "-r", src, dst], cpus)
    flush = Run(["sync", *files_under(dst)], cpus)
    copy.seconds += flush.seconds
    copy.disk_out += flush.disk_out
    return copy


def run_requant(first, out, cpus, jobs):
    """The run, with its CPU time (user + system, every process of it) as run.cpu."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = Run(ggtools_cmd("requant-trunk", first, "-o", out, "-q", *(["-j", str(jobs)] if jobs else [])), cpus)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run.cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return run


def floor_rows(best, cpus, trunk_values, one_thread_rate):
    """What the CPUs alone allow, warm, on `cpus` CPUs, against cp's time at scale (each less its small set's): the
    conversion's CPU time (at the one-thread rate measured in this process) spread over them, and requant-trunk's
    CPU time on the set less its CPU time on the small set, spread over them."""
    cp = best[("warm", cpus, "cp")].seconds - best[("warm", cpus, "cp", "small")].seconds
    conversion = trunk_values * 4 / 1e6 / one_thread_rate
    whole = best[("warm", cpus, "requant")].cpu - best[("warm", cpus, "requant", "small")].cpu
    return [[f"floor on {cpus} CPUs: the conversion's CPU time ({conversion:.2f} s) / {cpus}",
             f"{conversion / cpus:.2f} s", f"{cp:.2f} s", f"{conversion / cpus / cp:.2f}", ""],
            [f"floor on {cpus} CPUs: requant-trunk's CPU time at scale, warm ({whole:.2f} s) / {cpus}",
             f"{whole / cpus:.2f} s", f"{cp:.2f} s", f"{whole / cpus / cp:.2f}", ""]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/ggtools-bench-requant")
    ap.add_argument("--cpus", default="1,2", help="CPU counts to run on (taskset -c 0-N-1)")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the generated set")
    page.add_option(ap)
    args = ap.parse_args()
    report = sys.stderr if page.prints_markdown(args) else sys.stdout      # the section takes stdout
    cpu_counts = [int(c) for c in args.cpus.split(",")]

    src, copy, out = (os.path.join(args.dir, d) for d in ("src", "cp", "out"))
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(src)
    layers = layers_for(args.gb)
    paths = kimi_like_set(os.path.join(src, "kimi-like"), args.gb, args.shards)
    size = sum(os.path.getsize(p) for p in paths)
    plan = json.loads(subprocess.run([sys.executable, "-m", "ggtools", "requant-trunk", paths[0], "-o", out,
                                      "--dry-run", "--json"], check=True, capture_output=True, text=True).stdout)
    trunk = sum(t["bytes_in"] for s in plan["shards"] for t in s["tensors"] if t["action"] == "convert")
    trunk_values = sum(int(np.prod(t["ne"])) for s in plan["shards"] for t in s["tensors"] if t["action"] == "convert")
    out_size = sum(t["bytes_out"] for s in plan["shards"] for t in s["tensors"])
    print(f"set: {len(paths)} shards, {size / 1e9:.2f} GB, {layers} layers; trunk converted: {trunk / 1e9:.3f} GB "
          f"({100 * trunk / size:.1f} % of the bytes); cold = {cold_method()}; load {load_average()}", file=report)

    small_src = os.path.join(args.dir, "small")
    os.makedirs(small_src)
    small = small_set(os.path.join(small_src, "kimi-like"), args.shards)
    small_size = sum(os.path.getsize(p) for p in small)
    sets = {"set": (src, paths, cpu_counts), "small": (small_src, small, [max(cpu_counts)])}

    best, loads = {}, [os.getloadavg()[0]]
    for r in range(args.repeat):
        for cache in CACHES:
            for name, (set_dir, set_paths, set_cpus) in sets.items():
                for cpus in set_cpus:
                    for tool in in_turn(["cp", "requant"], r):
                        dst = copy if tool == "cp" else out
                        fresh(dst)
                        set_cache(cache, set_paths)
                        run = (run_cp(set_dir, dst, cpus) if tool == "cp"
                               else run_requant(set_paths[0], dst, cpus, args.jobs))
                        key = (cache, cpus, tool) if name == "set" else (cache, cpus, tool, name)
                        if key not in best or run.seconds < best[key].seconds:
                            best[key] = run
                        cpu = f" (CPU {run.cpu:.2f} s)" if tool == "requant" else ""
                        print(f"  round {r + 1}: {name:5} {cache:4} {cpus} CPU(s) {tool:7} {run.seconds:6.2f} s{cpu}",
                              file=report)
                loads.append(os.getloadavg()[0])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    fresh(copy)
    fresh(out)
    one, many, n, c = conversion_rates()

    times = []
    for cache in CACHES:
        for cpus in cpu_counts:
            rq, cp = best[(cache, cpus, "requant")], best[(cache, cpus, "cp")]
            goal = "<= 1.1" if cpus == 2 else ""
            times.append([cache, cpus, "whole process", f"{rq.seconds:.2f} s", f"{cp.seconds:.2f} s",
                          f"**{rq.seconds / cp.seconds:.2f}**", goal])
    for cache in CACHES:
        cpus = max(cpu_counts)
        rq, cp = (best[(cache, cpus, tool)].seconds - best[(cache, cpus, tool, "small")].seconds
                  for tool in ("requant", "cp"))
        times.append([cache, cpus, "at scale: the set's time less the small set's", f"{rq:.2f} s", f"{cp:.2f} s",
                      f"**{rq / cp:.2f}**", "<= 1.1" if cpus == 2 else ""])
    cold = best[("cold", max(cpu_counts), "requant")]
    cold_cp = best[("cold", max(cpu_counts), "cp")]
    io = cold.io or {}
    bytes_rows = [
        ["requant-trunk read (system calls)", f"{io.get('rchar', 0) / 1e9:.3f} GB", f"{io.get('rchar', 0) / size:.3f}",
         "of the set"],
        ["requant-trunk wrote (system calls)", f"{io.get('wchar', 0) / 1e9:.3f} GB",
         f"{io.get('wchar', 0) / out_size:.3f}", "of the output"],
        ["requant-trunk read from the disk (cold)", f"{cold.disk_in / 1e9:.3f} GB", f"{cold.disk_in / size:.3f}",
         "of the set"],
        ["requant-trunk wrote to the disk", f"{cold.disk_out / 1e9:.3f} GB", f"{cold.disk_out / out_size:.3f}",
         "of the output"],
        ["`cp -r` read from the disk (cold)", f"{cold_cp.disk_in / 1e9:.3f} GB", f"{cold_cp.disk_in / size:.3f}",
         "of the set"],
        ["`cp -r` + `sync` wrote to the disk", f"{cold_cp.disk_out / 1e9:.3f} GB", f"{cold_cp.disk_out / size:.3f}",
         "of the set"],
    ]
    other = [["peak RSS of a process", f"{peak / 1024:.0f} MB", "", "", "<= 300 MB"],
             ["Q8_0 -> Q4_K, 1 thread, against ggml's C", f"{one:.0f} MB/s", f"{c:.0f} MB/s" if c else "-",
              f"{one / c:.2f}" if c else "-", ""],
             [f"Q8_0 -> Q4_K, {n} threads, against 1", f"{many:.0f} MB/s", f"{one:.0f} MB/s", f"{many / one:.2f}", ""],
             *floor_rows(best, max(cpu_counts), trunk_values, one)]
    load = f"load average {min(loads):.2f}-{max(loads):.2f} during the runs"
    intro = (f"{len(paths)} shards, {size / 1e9:.2f} GB, trunk {trunk / 1e9:.3f} GB ({100 * trunk / size:.1f} % of "
             f"the bytes), output {out_size / 1e9:.2f} GB; best of {args.repeat} rounds, the two commands in turn; "
             f"cold: {cold_method()}; {load}. At scale: the same runs on a small set of the same shape "
             f"({len(small)} shards, {small_size / 1e9:.3f} GB) taken off, leaving what the set's bytes cost beyond "
             f"start-up (Python, numba's cache, a shard's fixed work), as on a set of hundreds of GB.")
    body = (intro + "\n\n" + page.table(["page cache", "CPUs", "measure", "requant-trunk", "`cp -r` + `sync`", "ratio",
                                         "goal"], times)
            + f"\n\nBytes moved, cold, {max(cpu_counts)} CPUs:\n\n"
            + page.table(["measure", "bytes", "ratio", ""], bytes_rows)
            + "\n\n" + page.table(["measure", "ours", "reference", "ratio", "goal"], other)
            + "\n\nConversion rates in MB of float32 values per second, in this process. The floors: the wall time "
              "the CPU work alone would take with every CPU busy all the time, against `cp -r` + `sync`'s time at "
              "scale.")
    page.publish(args, "requant", body)
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
