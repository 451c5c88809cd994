#!/usr/bin/env python3
"""Benchmark the gguf layer's parser on a real model (gemma3-270m, 262k-token vocabulary): ggtools' GGUFFile against
gguf-py's GGUFReader, in this process (goal: 50x faster). Whole processes as a user waits for them:
scripts/bench/startup.py; the `validate --deep` scan against reading: scripts/bench/validate.py.

  python -m scripts.bench.container [PATH] [--markdown [PAGE]]
"""

import argparse
import os
from pathlib import Path

import gguf

from ggtools.gguf import GGUFFile
from scripts.bench import page
from scripts.bench.diskio import add_gguf_argument, best_seconds, gguf_or_gemma


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_gguf_argument(ap)
    page.add_option(ap)
    args = ap.parse_args()
    path = gguf_or_gemma(args.path)
    size = os.path.getsize(path)

    ours = best_seconds(lambda: GGUFFile(path).close(), 5)
    theirs = best_seconds(lambda: gguf.GGUFReader(path), 2)
    if args.markdown:
        page.emit(args, "container", f"{Path(path).name}, {size / 1e6:.1f} MB, best of 5 (ours) / 2 (gguf-py), in "
                  "this process:\n\n" + page.table(
                      ["measure", "ggtools", "reference", "ratio", "goal"],
                      [["parse the header, KVs and tensor infos", f"{ours * 1e3:.1f} ms",
                        f"gguf-py GGUFReader {theirs * 1e3:.0f} ms", f"**{theirs / ours:.0f}x** faster", ">= 50x"]]))
        if page.prints_markdown(args):
            return
    print(f"file: {path} ({size / 1e6:.1f} MB)")
    print(f"parse: ggtools {ours * 1e3:.1f} ms, gguf-py GGUFReader {theirs * 1e3:.0f} ms "
          f"-> {theirs / ours:.0f}x faster (goal >= 50x)")


if __name__ == "__main__":
    main()
