#!/usr/bin/env python3
"""Benchmark the CPU runtime against llama.cpp, in one run, same threads, per model and thread count:

- greedy decode speed, ours / llama.cpp's (goal >= 1.0 on SmolLM2, >= 0.8 on the tiny targets);
- prompt processing rate, ours / llama.cpp's;
- a 16-token batch with all logits (a speculative verify): llama.cpp's time / ours (goal >= 1.0), and ours
  over our own 1-token step for reference.

Anchors: the test oracle (the installed llama-cpp-python, built with GGML_NATIVE=OFF: AVX2 at most, the code
paths ggtools reproduces bit for bit) and, with --native, llama.cpp built for this machine (GGML_NATIVE=ON:
AVX-512 / VNNI where the CPU has them; scripts/bench/native_llama.py builds it once, 5-10 minutes, the first time
--native is given). Each llama.cpp runs in its own child process (scripts/bench/llama_process.py).

The runtimes are measured alternately, round after round, and each figure is the best round: on a shared
machine other processes slow everything down unpredictably, and the best round is the least disturbed. Also
checks that ours and the oracle produced the same greedy tokens (the native build's numerics differ: its tokens
are reported, not required). The summary ends with a scaling table: decode tok/s per thread count.

Without GGUF arguments: SmolLM2-135M-Instruct Q4_1 (scripts/fixtures/smollm2.py) and the same model requantized
by llama.cpp to Q8_0 and Q4_K_M (cached), the tiny routed-expert targets of scripts/fixtures/moe_targets.py (qwen3moe F16 and
Q8_0, gpt-oss F16 and MXFP4_MOE) and the tiny Gated DeltaNet hybrids of scripts/fixtures/hybrid_targets.py (qwen35
F16 and Q8_0, qwen35moe F16 and MXFP4_MOE) and the tiny Kimi K3 of scripts/fixtures/kimi_k3_targets.py (F16, Q8_0
trunk + MXFP4 experts); built into the fixture cache on first use, left out when their oracles are not installed.

  python -m scripts.bench.runtime [GGUF ...] [--threads 1,2] [--native] [--tokens 64] [--rounds 3] [--json]
                                 [--markdown [PAGE]]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from ggtools.jobs.run import warm_up
from ggtools.runtime import TargetModel, Tokenizer, continue_greedy
from scripts.bench import native_llama, page
from scripts.bench.llama_process import LlamaProcess, best_step_cost

TINY_TARGETS = [("qwen3moe-target", "f16"), ("qwen3moe-target", "Q8_0"), ("gpt-oss-target", "f16"),
                ("gpt-oss-target", "MXFP4_MOE"), ("qwen35", "f16"), ("qwen35", "q8_0"), ("qwen35moe", "f16"),
                ("qwen35moe", "mxfp4_moe"), ("kimi-k3", "f16"), ("kimi-k3", "q8_0")]
SMOLLM2_REQUANTS = {"Q8_0": 7, "Q4_K_M": 15}     # llama_ftype: LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_K_M

PROMPT = ("The history of the Roman Empire spans more than a thousand years, from the founding of the "
          "city to the fall of Constantinople. In this essay we look at its government, its army, its "
          "roads and aqueducts, and the daily life of its citizens, beginning with")
# seconds of idle before each runtime's turn: on the 2-vCPU VM a decode right after another process's run measured
# 25-40 % slower than after a pause, whichever runtime came second
SETTLE_S = 1.0
DECODE_GOAL = {"SmolLM2": 1.0}     # by model name prefix; the tiny targets' goal is TINY_GOAL
TINY_GOAL = 0.8


def smollm2_models() -> list:
    """SmolLM2 Q4_1 and its Q8_0 / Q4_K_M requantizations by llama.cpp's quantizer (cached)."""
    from scripts.fixtures.fixture_cache import build_once, cache_root, recipe_hash
    from scripts.fixtures.llama_oracle import run_ops_subprocess
    from scripts.fixtures.smollm2 import fetch
    source = fetch()
    paths = [source]
    dest = cache_root() / "bench" / f"smollm2-requants-{recipe_hash(SMOLLM2_REQUANTS, Path(source).stat().st_size)}"

    def build(tmp: Path) -> dict:
        ops = [{"op": "quantize", "inp": source, "out": str(tmp / f"SmolLM2-135M-Instruct.{name}.gguf"),
                "ftype": ftype, "allow_requantize": True} for name, ftype in SMOLLM2_REQUANTS.items()]
        for result in run_ops_subprocess(ops):
            if not result.get("ok", True) or result.get("error"):
                raise RuntimeError(f"requantizing SmolLM2: {result}")
        return {name: f"SmolLM2-135M-Instruct.{name}.gguf" for name in SMOLLM2_REQUANTS}

    try:
        manifest = build_once(dest, build)
    except (ImportError, RuntimeError) as e:
        print(f"left out the SmolLM2 requantizations: {e}", file=sys.stderr)
        return paths
    return paths + [str(dest / manifest[name]) for name in SMOLLM2_REQUANTS]


def tiny_targets():
    """The tiny targets' GGUFs from the fixture cache (built if needed), [] when their oracles are missing."""
    from scripts.fixtures import tiny_models
    paths = []
    for unit, kind in TINY_TARGETS:
        try:
            directory, manifest = tiny_models.ensure(unit)
        except tiny_models.OracleMissing as e:
            print(f"left out {unit}: {e}", file=sys.stderr)
            continue
        files = manifest.get("gguf") or manifest["files"]     # the qwen35moe unit names its GGUFs "files"
        paths.append(str(directory / files[kind]["path"]))
    return paths


def best_of(n, fn):
    return min(fn() for _ in range(n))


class Ours:
    label = "ours"

    def __init__(self, path, threads):
        self.model = TargetModel(path, threads=threads)
        warm_up(self.model)

    def _prompt(self, ids):
        self.model.kv.clear()
        return self.model.forward(ids, logits="last")[0]

    def prompt(self, ids) -> float:
        t = time.perf_counter()
        self._prompt(ids)
        return time.perf_counter() - t

    def decode(self, ids, n):
        logits = self._prompt(ids)
        t = time.perf_counter()
        tokens, _ = continue_greedy(self.model, logits, n)
        return (n - 1) / (time.perf_counter() - t), tokens

    def step_cost(self, ids, n_batch) -> float:
        """Seconds for one forward of n_batch new tokens (all logits) after the prompt (best_step_cost)."""
        self._prompt(ids)
        n = self.model.kv.n_tokens

        def once():
            self.model.kv.crop(n)
            t = time.perf_counter()
            self.model.forward(ids[:n_batch], logits="all")
            return time.perf_counter() - t
        return best_step_cost(once)

    def close(self):
        pass


def anchors(native: bool) -> list:
    """[(label, lib directory or None)]: the native build first (the goals' anchor) when asked, then the oracle."""
    found = [("oracle", None)]
    if native:
        lib = native_llama.built_lib()
        if lib is None:
            print(f"building the native llama.cpp once ({native_llama.BUILD_COMMAND} does the same)...",
                  file=sys.stderr)
            lib = native_llama.build()
        found.insert(0, ("native", lib))
    return found


def measure(path, threads, tokens, rounds, anchor_libs):
    ours = Ours(path, threads)
    refs = [LlamaProcess(path, threads, lib, label) for label, lib in anchor_libs]
    try:
        return _measure(path, threads, tokens, rounds, ours, refs)
    finally:
        for ref in refs:
            ref.close()


def _measure(path, threads, tokens, rounds, ours, refs):
    ids = Tokenizer.from_gguf(ours.model.weights.meta).encode(PROMPT)
    add_bos = bool(ours.model.weights.meta.get("tokenizer.ggml.add_bos_token", False))
    for ref in refs:
        assert ids == ref.tokenize(PROMPT, add_bos), f"tokenizers disagree ({ref.label})"

    res = {"model": path, "threads": threads, "prompt_tokens": len(ids), "rounds": rounds,
           "anchors": [ref.label for ref in refs]}
    best, generated = {}, {}
    for _ in range(rounds):
        for runtime in [ours] + refs:
            name = runtime.label
            time.sleep(SETTLE_S)
            sample = {"prompt_s": best_of(2, lambda: runtime.prompt(ids))}
            rate, generated[name] = runtime.decode(ids, tokens)
            sample.update(decode_tok_s=-rate, step1_s=runtime.step_cost(ids, 1), step16_s=runtime.step_cost(ids, 16))
            for key, value in sample.items():        # every figure kept as a cost: lower is better
                best[f"{name}_{key}"] = min(best.get(f"{name}_{key}", float("inf")), value)
    for key, value in best.items():
        res[key] = -value if key.endswith("decode_tok_s") else value
    res["ours_batch16_over_step1"] = res["ours_step16_s"] / res["ours_step1_s"]
    for ref in refs:
        a = ref.label
        res[f"{a}_same_greedy_tokens"] = generated["ours"] == generated[a]
        res[f"{a}_decode_ratio"] = res["ours_decode_tok_s"] / res[f"{a}_decode_tok_s"]
        res[f"{a}_prompt_ratio"] = res[f"{a}_prompt_s"] / res["ours_prompt_s"]
        res[f"{a}_verify16_ratio"] = res[f"{a}_step16_s"] / res["ours_step16_s"]
    return res


def decode_goal(path) -> float:
    name = Path(path).name
    return next((g for prefix, g in DECODE_GOAL.items() if name.startswith(prefix)), TINY_GOAL)


def report(res, tokens):
    n = res["prompt_tokens"]
    print(f"model {res['model']}\nthreads {res['threads']}, prompt {n} tokens, decode {tokens} tokens, "
          f"best of {res['rounds']} alternating rounds")
    print(f"  ours:      decode {res['ours_decode_tok_s']:8.1f} tok/s, prompt {n / res['ours_prompt_s']:8.1f} tok/s, "
          f"16-token batch {res['ours_step16_s'] * 1e3:7.2f} ms, 1-token step {res['ours_step1_s'] * 1e3:6.2f} ms")
    for a in res["anchors"]:
        print(f"  {a + ':':<10} decode {res[f'{a}_decode_tok_s']:8.1f} tok/s, prompt "
              f"{n / res[f'{a}_prompt_s']:8.1f} tok/s, 16-token batch {res[f'{a}_step16_s'] * 1e3:7.2f} ms, "
              f"1-token step {res[f'{a}_step1_s'] * 1e3:6.2f} ms")
        print(f"  ours / {a}: decode {res[f'{a}_decode_ratio']:.2f} (goal >= {decode_goal(res['model'])}), prompt "
              f"{res[f'{a}_prompt_ratio']:.2f}, 16-token batch {res[f'{a}_verify16_ratio']:.2f} (its time / ours, "
              f"goal >= 1); same greedy tokens: {res[f'{a}_same_greedy_tokens']}")
    print()


def summary(results):
    labels = results[0]["anchors"]
    head = f"{'model':<40} {'thr':>3}"
    for a in labels:
        head += f" {'dec/' + a:>11} {'prm/' + a:>11} {'b16/' + a:>11} {'same':>5}"
    print(head)
    for r in results:
        line = f"{Path(r['model']).name[:40]:<40} {r['threads']:>3}"
        for a in labels:
            line += (f" {r[f'{a}_decode_ratio']:>11.2f} {r[f'{a}_prompt_ratio']:>11.2f} {r[f'{a}_verify16_ratio']:>11.2f}"
                     f" {str(r[f'{a}_same_greedy_tokens']):>5}")
        print(line)
    threads, by_model = decode_by_threads(results)
    if len(threads) > 1:
        print("\ndecode tok/s by threads (ours / " + " / ".join(labels) + ")")
        print(f"{'model':<40} " + " ".join(f"{t:>22}" for t in threads))
        for model, cells in by_model:
            print(f"{model[:40]:<40} " + " ".join(f"{c:>22}" for c in cells))


def decode_by_threads(results) -> tuple:
    """(thread counts, [(model file name, ["ours / anchor... tok/s" per thread count])]): the scaling table."""
    runtimes = ["ours"] + results[0]["anchors"]
    threads = sorted({r["threads"] for r in results})
    by_model = []
    for model in dict.fromkeys(r["model"] for r in results):
        cells = []
        for t in threads:
            r = next((r for r in results if r["model"] == model and r["threads"] == t), None)
            cells.append(" / ".join(f"{r[f'{a}_decode_tok_s']:.0f}" for a in runtimes) if r else "-")
        by_model.append((Path(model).name, cells))
    return threads, by_model


def markdown(results, tokens) -> str:
    """The section of docs/benchmarks.md: ratios ours / anchor per model and thread count, then decode tok/s by
    threads when there are several."""
    labels = results[0]["anchors"]
    header = ["model", "threads", "decode tok/s ours"]
    for a in labels:
        header += [f"decode /{a}", f"prompt /{a}", f"16-row batch /{a}"]
    header.append("same tokens as the oracle")
    rows = []
    for r in results:
        row = [Path(r["model"]).name, r["threads"], f"{r['ours_decode_tok_s']:.0f}"]
        for a in labels:
            row += [f"{r[f'{a}_decode_ratio']:.2f}", f"{r[f'{a}_prompt_ratio']:.2f}", f"{r[f'{a}_verify16_ratio']:.2f}"]
        rows.append(row + ["yes" if r.get("oracle_same_greedy_tokens") else "**no**"])
    text = (f"{results[0]['prompt_tokens']}-token prompt, {tokens} greedy tokens, best of {results[0]['rounds']} "
            "alternating rounds; every ratio is ours / the anchor's speed (for the 16-row batch: the anchor's time / "
            "ours), so above 1 means ours is faster:\n\n" + page.table(header, rows))
    threads, by_model = decode_by_threads(results)
    if len(threads) > 1:
        text += (f"\n\nDecode tok/s by threads (ours / {' / '.join(labels)}):\n\n"
                 + page.table(["model"] + [str(t) for t in threads], [[m] + cells for m, cells in by_model]))
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", nargs="*", help="target GGUFs (default: the SmolLM2 variants and the tiny targets)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--native", action="store_true",
                    help="also compare against llama.cpp built for this CPU (GGML_NATIVE=ON; built once on first use)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens to decode")
    ap.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds (best is kept)")
    ap.add_argument("--json", action="store_true")
    page.add_option(ap)
    args = ap.parse_args()
    anchor_libs = anchors(args.native)
    paths = args.gguf or smollm2_models() + tiny_targets()
    print(f"CPU flags: {native_llama.simd_flags()}", file=sys.stderr)
    if args.native:
        print(native_llama.describe(), file=sys.stderr)
    results = []
    for path in paths:
        for threads in (int(t) for t in args.threads.split(",")):
            results.append(measure(path, threads, args.tokens, args.rounds, anchor_libs))
            if not args.json and not page.prints_markdown(args):
                report(results[-1], args.tokens)
    if args.json:
        print(json.dumps({"cpu_flags": native_llama.simd_flags(), "results": results}, indent=1))
    elif args.markdown:
        page.emit(args, "runtime", markdown(results, args.tokens))
    if not args.json and not page.prints_markdown(args):
        summary(results)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
