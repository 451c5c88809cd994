#!/usr/bin/env python3
"""Benchmark requant-trunk on a generated Kimi-like shard set (trunk ≈ 5% of the bytes), all in one run:

- wall time of `ggtools requant-trunk` (verification on) / wall time of `cp` of the same set (goal ≤ 1.5);
- peak RSS of the requant process (goal ≤ 300 MB), whatever the shard size;
- Q8_0 → Q4_K conversion rate: ours (one thread, all threads) vs ggml's C reference (one thread).

  python -m scripts.bench.requant [--gb 2] [--shards 4] [--dir /tmp/ggtools-bench] [-j N] [--repeat 3] [--keep]
                                  [--markdown [PAGE]]
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from ggtools import quants
from ggtools.samples import write_moe_set
from scripts.bench import page

HIDDEN, FFN, EXPERTS, VOCAB = 1024, 512, 128, 32000


def layers_for(gb):
    per_layer = 3 * HIDDEN * FFN * EXPERTS * 17 / 32 + (2 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN) * 34 / 32
    return max(1, round((gb * 1e9 - 2 * HIDDEN * VOCAB * 34 / 32) / per_layer))


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def best_seconds(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def drop_caches_hint():
    return "source in the page cache for both: the set was just written"


def conversion_rates(mb=16):
    rows = int(mb * 1e6 / 4 / 4096)
    q8 = quants.quantize(T.Q8_0, np.random.default_rng(0).standard_normal((rows, 4096), dtype=np.float32) * 0.02)
    values = quants.dequantize(T.Q8_0, q8)
    quants.requantize(T.Q8_0, T.Q4_K, q8[:1])                       # JIT compile / cache load

    def ours(threads):
        numba.set_num_threads(threads)
        quants.requantize(T.Q8_0, T.Q4_K, q8[:64])      # the first launch after a thread-count change costs extra
        return values.nbytes / best_seconds(lambda: quants.requantize(T.Q8_0, T.Q4_K, q8)) / 1e6

    all_threads = numba.config.NUMBA_NUM_THREADS
    one, many = ours(1), ours(all_threads)
    numba.set_num_threads(all_threads)
    c = None
    try:
        from tests.ggml_oracle import load_ggml
        ggml = load_ggml()
        c = values.nbytes / best_seconds(lambda: ggml.quantize(T.Q4_K, quants.dequantize(T.Q8_0, q8))) / 1e6
    except BaseException as e:        # pytest.skip is a BaseException
        print(f"(ggml C reference not available: {e})")
    return one, many, all_threads, c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/ggtools-bench-requant")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the generated set")
    page.add_option(ap)
    args = ap.parse_args()

    src, copy, out = (os.path.join(args.dir, d) for d in ("src", "cp", "out"))
    shutil.rmtree(args.dir, ignore_errors=True)
    for d in (src, out):
        os.makedirs(d)
    layers = layers_for(args.gb)
    paths = write_moe_set(os.path.join(src, "kimi-like"), layers=layers, hidden=HIDDEN, ffn=FFN, experts=EXPERTS,
                          vocab=VOCAB, shards=args.shards)
    total = sum(os.path.getsize(p) for p in paths)
    plan_cmd = ["ggtools", "requant-trunk", paths[0], "-o", out, "--dry-run", "--json"]
    import json
    plan = json.loads(subprocess.run(plan_cmd, check=True, capture_output=True, text=True).stdout)
    trunk = sum(t["bytes_in"] for s in plan["shards"] for t in s["tensors"] if t["action"] == "convert")
    report = sys.stderr if page.prints_markdown(args) else sys.stdout      # the section takes stdout
    print(f"set: {len(paths)} shards, {total / 1e9:.2f} GB, {layers} layers; trunk converted: "
          f"{trunk / 1e9:.3f} GB ({100 * trunk / total:.1f}% of the bytes)", file=report)

    jobs = ["-j", str(args.jobs)] if args.jobs else []
    t_cp, t_cp_sync, t_rq, peak = [], [], [], 0
    for _ in range(args.repeat):          # alternate the two, keep the best of each: the machine is shared
        subprocess.run(["sync"], check=True)
        t_cp.append(timed(["cp", "-r", src, copy]))
        t_cp_sync.append(t_cp[-1] + timed(["sync"]))
        shutil.rmtree(copy)
        shutil.rmtree(out)
        os.makedirs(out)
        subprocess.run(["sync"], check=True)
        t_rq.append(timed(["ggtools", "requant-trunk", paths[0], "-o", out, "-q", *jobs]))
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    t_cp, t_sync_total, t_rq = min(t_cp), min(t_cp_sync), min(t_rq)
    print(f"best of {args.repeat}: requant-trunk (verify on, outputs fsync'ed) {t_rq:.2f} s; cp -r {t_cp:.2f} s -> "
          f"ratio {t_rq / t_cp:.2f} (goal <= 1.5); cp -r + sync {t_sync_total:.2f} s -> ratio "
          f"{t_rq / t_sync_total:.2f} ({drop_caches_hint()})", file=report)
    print(f"peak RSS of the largest child process: {peak / 1024:.0f} MB (goal <= 300 MB)", file=report)
    one, many, n, c = conversion_rates()
    line = f"Q8_0 -> Q4_K conversion: ours {one:.1f} MB/s on 1 thread, {many:.1f} MB/s on {n} threads"
    if c:
        line += f"; ggml C reference {c:.1f} MB/s on 1 thread -> ratio {one / c:.2f} (1 thread)"
    print(line + " (MB of float32 values per second)", file=report)
    if args.markdown:
        rows = [["requant-trunk (verify on, outputs fsync'ed) / `cp -r`", f"{t_rq:.2f} s", f"{t_cp:.2f} s",
                 f"**{t_rq / t_cp:.2f}**", "<= 1.5"],
                ["requant-trunk / `cp -r` + `sync`", f"{t_rq:.2f} s", f"{t_sync_total:.2f} s",
                 f"{t_rq / t_sync_total:.2f}", ""],
                ["peak RSS of a worker process", f"{peak / 1024:.0f} MB", "", "", "<= 300 MB"],
                ["Q8_0 -> Q4_K, 1 thread, against ggml's C", f"{one:.0f} MB/s", f"{c:.0f} MB/s" if c else "-",
                 f"{one / c:.2f}" if c else "-", ""],
                [f"Q8_0 -> Q4_K, {n} threads", f"{many:.0f} MB/s", "", "", ""]]
        page.emit(args, "requant", f"{len(paths)} shards, {total / 1e9:.2f} GB, trunk {trunk / 1e9:.3f} GB "
                  f"({100 * trunk / total:.1f} % of the bytes), best of {args.repeat} alternating runs, the source in "
                  "the page cache; conversion rates in MB of float32 values per second:\n\n"
                  + page.table(["measure", "ours", "reference", "ratio", "goal"], rows))
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
