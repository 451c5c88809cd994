"""Benchmark ggtools.quants against ggml's C reference (libggml-base from llama-cpp-python).

For each type: quantize and dequantize throughput in MB of float32 per second, ours on one
thread, ggml's C on one thread (ggml_quantize_chunk / the type's to_float, called through ctypes
on the same data), the ratio ours/C, and ours on all cores; plus the first call's time (JIT
compile, or loading numba's on-disk cache when warm). Without llama-cpp-python only our
figures are printed.

    python -m scripts.bench.quants [--mb 8] [--repeat 3] [--types q4_k,q2_k] [--cold] [--markdown [PAGE]]

--cold compiles into an empty numba cache, so "first call" is the JIT compile time; without it,
a second run shows the time to load the cached machine code.
"""

import argparse
import os
import sys
import tempfile
import time

if __name__ == "__main__" and "--cold" in sys.argv:  # before numba reads its configuration
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="ggtools-bench-numba-")

import numba  # noqa: E402
import numpy as np  # noqa: E402

from ggtools import quants  # noqa: E402
from scripts.bench import page  # noqa: E402
from scripts.bench.diskio import load_average  # noqa: E402

QUANT_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
               "f16", "bf16"]
DEQUANT_ONLY = ["mxfp4"]


def load_c_reference():
    try:
        from tests.ggml_oracle import load_ggml
        return load_ggml()
    except BaseException as exc:  # pytest.skip raises a BaseException subclass
        print(f"ggml C reference not available ({exc}); printing our figures only")
        return None


def best_seconds(fn, repeat, clock=time.perf_counter):
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def thread_seconds(fn, repeat):
    """Best CPU time of the calling thread: single-thread figures (ours with numba set to one
    thread runs in the calling thread, as does the C call), robust on a busy machine."""
    return best_seconds(fn, repeat, time.thread_time)


def on_threads(n, fn):
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


def interleaved(ours, ref, repeat):
    """Best single-thread seconds of ours and of ref (None when ref is None), timed turn about
    so that both see the same machine load."""
    def alternate():
        ours()                   # the first launch after a thread-count change costs extra
        best_ours = best_ref = float("inf")
        for _ in range(repeat):
            best_ours = min(best_ours, thread_seconds(ours, 1))
            if ref is not None:
                best_ref = min(best_ref, thread_seconds(ref, 1))
        return best_ours, (best_ref if ref is not None else None)

    return on_threads(1, alternate)


def figures(mb, ours, ref, repeat, cores):
    ours1, ref1 = interleaved(ours, ref, repeat)
    oursn = on_threads(cores, lambda: best_seconds(ours, repeat))
    return mb / ours1, (mb / ref1 if ref1 else None), mb / oursn


def measure(name, x, ggml, repeat):
    """(first_call_s, quantize figures, dequantize figures); figures: ours 1T, C 1T, ours all
    cores, in MB of float32 per second."""
    qtype = quants.parse_qtype(name)
    mb = x.nbytes / 1e6
    cores = numba.config.NUMBA_NUM_THREADS
    start = time.perf_counter()
    if quants.has_quantizer(qtype):
        quants.quantize(qtype, x[:1])
    quants.dequantize(qtype, np.zeros((1, quants.row_bytes(qtype, x.shape[1])), np.uint8))
    first_call = time.perf_counter() - start

    quant = None
    if quants.has_quantizer(qtype):
        data = quants.quantize(qtype, x)
        quant = figures(mb, lambda: quants.quantize(qtype, x, out=data),
                        (lambda: ggml.quantize(qtype, x)) if ggml else None, repeat, cores)
    else:
        data = np.random.default_rng(0).integers(0, 255, (x.shape[0], quants.row_bytes(qtype, x.shape[1])),
                                                 dtype=np.uint8)
    out = np.empty_like(x)
    dequant = figures(mb, lambda: quants.dequantize(qtype, data, out=out),
                      (lambda: ggml.dequantize(qtype, data, x.shape[1])) if ggml else None, repeat, cores)
    return first_call, quant, dequant


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
    parser.add_argument("--cold", action="store_true", help="compile into an empty numba cache")
    page.add_option(parser)
    args = parser.parse_args()

    load_before = load_average()
    ggml = load_c_reference()
    n = 4096
    rows = max(1, int(args.mb * 1e6 / 4 / n))
    x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)
    intro = (f"{rows}x{n} float32 ({x.nbytes / 1e6:.1f} MB), best of {args.repeat} (1T: thread CPU "
             f"time; all cores: wall time), first call {'compiles' if args.cold else 'uses the cache'}, "
             f"{numba.config.NUMBA_NUM_THREADS} cores; figures in MB of float32 per second")
    header = ["type", "first call s", "quant 1T", "C 1T", "ratio", "all cores",
              "dequant 1T", "C 1T", "ratio", "all cores"]
    quiet = page.prints_markdown(args)
    if not quiet:
        print(intro)
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
    table = []
    for name in args.types.split(","):
        first, quant, dequant = measure(name.strip(), x, ggml, args.repeat)
        table.append([name.strip().upper(), f"{first:.2f}"] + cells(quant) + cells(dequant))
        if not quiet:
            print("| " + " | ".join(table[-1]) + " |", flush=True)
    layer = f"numba threading layer: {numba.threading_layer()}"
    load = f"load average {load_before} before, {load_average()} after (the all-cores column needs a quiet machine)"
    if not quiet:
        print(layer)
        print(load)
    if args.markdown:
        page.emit(args, "quants", f"{intro}; {layer}; {load}.\n\n{page.table(header, table)}")

if __name__ == "__main__":
    main()
