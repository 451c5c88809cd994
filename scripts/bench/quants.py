"""Benchmark ggtools.quants against ggml's C reference (libggml-base from llama-cpp-python).

For each type: quantize and dequantize throughput in MB of float32 per second, ours on one
thread, ggml's C on one thread (ggml_quantize_chunk / the type's to_float, called through ctypes
on the same data), the ratio ours/C, and ours on all cores; plus the first call's time (JIT
compile, or loading numba's on-disk cache when warm). Without llama-cpp-python only our
figures are printed.

    python scripts/bench/quants.py [--mb 8] [--repeat 3] [--types q4_k,q2_k]
"""

import argparse
import os
import sys
import time

import numba
import numpy as np

from ggtools import quants

QUANT_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
               "f16", "bf16"]
DEQUANT_ONLY = ["mxfp4"]


def load_c_reference():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    try:
        from ggml_oracle import load_ggml
        return load_ggml()
    except BaseException as exc:  # pytest.skip raises a BaseException subclass
        print(f"ggml C reference not available ({exc}); printing our figures only")
        return None


def best_seconds(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def on_threads(n, fn):
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


def measure(name, x, ggml, repeat):
    """(first_call_s, [quantize figures], [dequantize figures]); figures: ours 1T, C 1T, all."""
    qtype = quants.parse_qtype(name)
    mb = x.nbytes / 1e6
    start = time.perf_counter()
    if quants.has_quantizer(qtype):
        quants.quantize(qtype, x[:1])
    quants.dequantize(qtype, np.zeros((1, quants.row_bytes(qtype, x.shape[1])), np.uint8))
    first_call = time.perf_counter() - start
    cores = numba.config.NUMBA_NUM_THREADS

    quant = None
    if quants.has_quantizer(qtype):
        data = quants.quantize(qtype, x)
        ours1 = on_threads(1, lambda: best_seconds(lambda: quants.quantize(qtype, x, out=data), repeat))
        oursn = on_threads(cores, lambda: best_seconds(lambda: quants.quantize(qtype, x, out=data), repeat))
        c1 = best_seconds(lambda: ggml.quantize(qtype, x), repeat) if ggml else None
        quant = (mb / ours1, mb / c1 if c1 else None, mb / oursn)
    else:
        data = np.random.default_rng(0).integers(0, 255, (x.shape[0], quants.row_bytes(qtype, x.shape[1])),
                                                 dtype=np.uint8)
    out = np.empty_like(x)
    ours1 = on_threads(1, lambda: best_seconds(lambda: quants.dequantize(qtype, data, out=out), repeat))
    oursn = on_threads(cores, lambda: best_seconds(lambda: quants.dequantize(qtype, data, out=out), repeat))
    c1 = best_seconds(lambda: ggml.dequantize(qtype, data, x.shape[1]), repeat) if ggml else None
    return first_call, quant, (mb / ours1, mb / c1 if c1 else None, mb / oursn)


def cells(fig):
    if fig is None:
        return ["-", "-", "-", "-"]
    ours1, c1, oursn = fig
    if c1 is None:
        return [f"{ours1:.0f}", "-", "-", f"{oursn:.0f}"]
    return [f"{ours1:.0f}", f"{c1:.0f}", f"{ours1 / c1:.2f}", f"{oursn:.0f}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=8.0, help="MB of float32 input per type")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure (best counts)")
    parser.add_argument("--types", default=",".join(QUANT_TYPES + DEQUANT_ONLY))
    args = parser.parse_args()

    ggml = load_c_reference()
    n = 4096
    rows = max(1, int(args.mb * 1e6 / 4 / n))
    x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)
    print(f"{rows}x{n} float32 ({x.nbytes / 1e6:.1f} MB), best of {args.repeat}, "
          f"{numba.config.NUMBA_NUM_THREADS} cores, numba threading layer "
          f"{numba.config.THREADING_LAYER}; figures in MB of float32 per second")
    header = ["type", "first call s", "quant 1T", "C 1T", "ratio", "all cores",
              "dequant 1T", "C 1T", "ratio", "all cores"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for name in args.types.split(","):
        first, quant, dequant = measure(name.strip(), x, ggml, args.repeat)
        row = [name.strip().upper(), f"{first:.2f}"] + cells(quant) + cells(dequant)
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
