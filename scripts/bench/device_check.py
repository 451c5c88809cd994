#!/usr/bin/env python3
"""The torch backend on a CUDA GPU (scripts/device_check.sh runs this): what could not be checked on the CPU.

1. Dequantizers on the GPU: every runtime type, random blocks, bit-exact with ggtools.quants (the CPU tests
   prove this for torch on the CPU; CUDA's own conversions are checked here).
2. The demo pair's target in f32 on the GPU against the numba runtime: max |logit difference|, relative.
3. The demo pair (drafters converted and quantized on the fly) and the largest pair available, on the GPU in
   the compute dtype: speculative and target-only tok/s, the speedup, tau (z-lab's), outputs equal to greedy.
   The largest pair is --target/--draft when given, else the largest fixture pair in the cache.
4. A draft tree (DDTree, --tree-budget, default 22) on the demo f16 pair and the largest pair: the same figures,
   its AL (mean accepted length incl. the bonus) beside the chain's, outputs equal to greedy.

Exits 1 with one line when no CUDA device is present, or when a check fails. `--device cpu --dtype f32` runs
the same checks on the CPU (how this script itself is tested where no GPU is lent).

  python -m scripts.bench.device_check [--device cuda:0] [--dtype bf16] [--target T.gguf --draft D.gguf]
      [--prompts 6] [-n 64] [--json]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "MXFP4"]


def check_cuda(device: str):
    try:
        import torch
    except ImportError:
        sys.exit("device_check: torch is not installed (pip install 'ggtools[torch]' with a CUDA build of torch)")
    if device != "cpu" and not torch.cuda.is_available():
        sys.exit(f"device_check: no CUDA device: torch {torch.__version__} sees none (CUDA build: "
                 f"{torch.version.cuda or 'no'}); nothing was run")
    return torch


def dequantizers_on_gpu(torch, device) -> list[str]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

    from ggtools import quants
    from ggtools.runtime.torch_backend.dequant import dequantize
    failed = []
    for name in TYPES:
        qtype = T[name]
        qk, size = GGML_QUANT_SIZES[qtype]
        data = np.random.default_rng(int(qtype)).integers(0, 256, (256, 1024 // qk * size), dtype=np.uint8)
        want = quants.dequantize(qtype, data, 1024)
        got = dequantize(qtype, torch.from_numpy(data).to(device), 1024).cpu().numpy()
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        if not same.all():
            failed.append(name)
    return failed


def f32_logits_against_numba(device) -> float:
    from ggtools.jobs.demo import demo_data
    from ggtools.runtime import TargetModel
    target = str(demo_data() / "target.gguf")
    ids = list(range(100, 164))
    want, _ = TargetModel(target, threads=1).forward(ids)
    got, _ = TargetModel(target, backend="torch", device=device, dtype="f32").forward(ids)
    return float(np.abs(got - want).max() / np.abs(want).max())


def fixture_pairs() -> list[tuple[str, str, str]]:
    """(name, target, drafter): the tiny qwen3 target (8 layers, hidden 256, the largest fixture with llama.cpp-
    converted drafters) with its DFlash v1 and DFlash2 drafters, built into the fixture cache if needed."""
    from scripts.fixtures import tiny_models
    try:
        d, m = tiny_models.ensure("target")
        rd, rm = tiny_models.ensure("drafter-refs")
    except tiny_models.OracleMissing as e:      # only the demo pair and --target/--draft
        print(f"no fixture pairs: {e}", file=sys.stderr)
        return []
    return [(f"tiny qwen3 + {v}", str(d / m["gguf"]["f16"]["path"]), str(rd / rm["refs"][f"{v}/f16"]["path"]))
            for v in ("v1", "v2")]


def measure(target, draft, prompts, n, device, dtype, tree_budget=None) -> dict:
    from ggtools.jobs.run import DraftSettings, run_speculative
    t0 = time.perf_counter()
    run = run_speculative(target, draft, prompts, n, ring_cap=4096, backend="torch", device=device, dtype=dtype,
                          settings=DraftSettings(tree_budget=tree_budget))
    return {"target": target, "draft": draft, "tree_budget": tree_budget,
            "speculative_tok_s": run.speculative_tokens_per_second,
            "target_only_tok_s": run.target_only_tokens_per_second, "speedup": run.speedup,
            "tau_zlab": run.stats["tau_zlab"], "al": run.stats["mean_accepted_length_incl_bonus"],
            "verified_per_step": run.stats["verified_per_step"], "acceptance": run.acceptance_rate,
            "outputs_match_greedy": run.outputs_match_target, "seconds": time.perf_counter() - t0}


def demo_pair(work: Path, prompts: int):
    from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
    from ggtools.runtime import TargetModel, Tokenizer
    target = str(demo_data() / "target.gguf")
    drafters = {v.name: v.path for v in build_drafters(work, target)}
    tokenizer = Tokenizer.from_gguf(TargetModel(target, threads=1).weights.meta)
    return target, drafters, [ids for _, ids in held_out_prompts(tokenizer, prompts)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--target", help="A large target GGUF (first shard) to run with --draft.")
    ap.add_argument("--draft", help="Its DFlash drafter GGUF.")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--tree-budget", type=int, default=22)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch = check_cuda(args.device)
    report = {"device": "cpu" if args.device == "cpu" else torch.cuda.get_device_name(torch.device(args.device)),
              "dtype": args.dtype}
    report["dequantizers_not_bit_exact"] = dequantizers_on_gpu(torch, args.device)
    report["demo_target_f32_rel_logit_diff"] = f32_logits_against_numba(args.device)
    with tempfile.TemporaryDirectory(prefix="ggtools-device-check-") as tmp:
        target, drafters, prompts = demo_pair(Path(tmp), args.prompts)
        pairs = [("demo " + name, target, path) for name, path in drafters.items()]
        pairs += [("given", args.target, args.draft)] if args.target and args.draft else fixture_pairs()
        report["pairs"] = []
        rng = np.random.default_rng(0)
        for name, t, d in pairs:
            ids = prompts if name.startswith("demo") else [[1] + rng.integers(3, 1000, 63).tolist()
                                                           for _ in range(args.prompts)]
            report["pairs"].append({"name": name} | measure(t, d, ids, args.n, args.device, args.dtype))
            if name == "demo f16" or not name.startswith("demo"):
                report["pairs"].append({"name": f"{name}, tree {args.tree_budget}"} | measure(
                    t, d, ids, args.n, args.device, args.dtype, args.tree_budget))
    failed = report["dequantizers_not_bit_exact"] or report["demo_target_f32_rel_logit_diff"] > 1e-3 or \
        not all(p["outputs_match_greedy"] for p in report["pairs"])
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        bad = report["dequantizers_not_bit_exact"]
        print(f"device {report['device']}, compute dtype {args.dtype}")
        print(f"dequantizers bit-exact on the device: {'NOT ' + ', '.join(bad) if bad else f'all {len(TYPES)} types'}")
        print(f"demo target, f32 on the device against numba: max |logit diff| "
              f"{report['demo_target_f32_rel_logit_diff']:.2e} relative")
        for p in report["pairs"]:
            print(f"{p['name']}: speculative {p['speculative_tok_s']:.1f} tok/s, target-only "
                  f"{p['target_only_tok_s']:.1f} tok/s, speedup {p['speedup']:.2f}x, tau {p['tau_zlab']:.3f}, AL "
                  f"{p['al']:.3f}, {p['verified_per_step']:.1f} rows/step, outputs "
                  f"{'equal' if p['outputs_match_greedy'] else 'DIFFER from'} greedy ({p['seconds']:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
