#!/usr/bin/env python3
"""The torch backend on a CUDA GPU (scripts/device_check.sh runs this): what could not be checked on the CPU.

1. Dequantizers on the GPU: every runtime type, random blocks, bit-exact with ggtools.quants (the CPU tests
   prove this for torch on the CPU; CUDA's own conversions are checked here).
2. float32 on the GPU is llama.cpp's CPU arithmetic (runtime/torch_backend/ggml_math.py, ggml_matmul.py): bit
   for bit against the numba runtime, every weight type's product in each summation layout llama.cpp picks
   (integer block dots and fma chains, tinyBLAS and vec_dot lanes, one row, stepwise, an expert's rows), ggml's
   float functions (vector expf, glibc's expf / logf, SiLU, softmax, rms_norm), the demo target's logits in
   F16 and requantized here to Q8_0, Q4_0 (repacked), Q4_1 and Q5_1, the demo drafters' block logits (f16, q8_0,
   q4-mix, q2_k: K-quants) and the fixture cache's quantized MoE / hybrid targets when it has them (Q8_0 and
   MXFP4 experts, Gated DeltaNet, kimi-k3's KDA and MLA), each target's logits as a batch, as one-token steps
   and as a draft tree's rows; the demo pair's speculative steps and tau in f32 equal numba's.
3. The demo pair (drafters converted and quantized on the fly) and the largest pair available, on the GPU in
   the compute dtype: speculative and target-only tok/s, the speedup, tau (z-lab's), outputs equal to greedy.
   The largest pair is --target/--draft when given, else the largest fixture pair in the cache.
4. A draft tree (DDTree, --tree-budget, default 22) on the demo f16 pair and the largest pair: the same figures,
   its AL (mean accepted length incl. the bonus) beside the chain's, outputs equal to greedy.

Exits 1 with one line when no CUDA device is present, or when a check fails. `--device cpu --dtype f32` runs
the same checks on the CPU (how this script itself is tested where no GPU is lent).

  python -m scripts.bench.device_check [--device cuda:0] [--dtype bf16] [--target T.gguf --draft D.gguf]
      [--prompts 6] [-n 64] [--json] [--markdown [PAGE]]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from scripts.bench import page

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


def same_bits(got, want) -> bool:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return bool(((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))).all())


def products_on_device(torch, device) -> list[str]:
    """Every weight type's float32 product on the device against numba's: a batch, one row, a stepwise batch
    and an expert's rows, in shapes that take each of llama.cpp's layouts (rows a multiple of 8 or not, an odd
    block count, float rows with a remainder)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

    from ggtools import quants
    from ggtools.runtime.torch_backend.matrix import DeviceMatrix
    from ggtools.runtime.weights import Matrix, MatrixGroup
    failed = []
    rng = np.random.default_rng(1)
    for name in TYPES:
        qtype = T[name]
        qk = GGML_QUANT_SIZES[qtype][0]
        shapes = {256: [(48, 512), (45, 256)], 32: [(48, 512), (45, 480)]}.get(qk, [(48, 512), (45, 520), (44, 516)])
        for n_rows, n_cols in shapes:
            w = rng.standard_normal((3 * n_rows, n_cols)).astype(np.float32) * 0.1
            if qtype == T.MXFP4:
                import gguf
                data = gguf.quants.quantize(w, T.MXFP4).view(np.uint8)
            else:
                data = quants.quantize(qtype, w)
            buf = np.ascontiguousarray(data).reshape(-1)
            numba_m = Matrix("w", qtype, n_rows, n_cols, buf, n_expert=3)
            device_m = DeviceMatrix.from_buffer("w", qtype, n_rows, n_cols, buf, 0, 3, device=torch.device(device),
                                                dtype=torch.float32)
            x = rng.standard_normal((5, n_cols)).astype(np.float32)
            ok = all(same_bits(device_m.product(torch.from_numpy(rows).to(device), stepwise=step).cpu(),
                               numba_m(rows, step)) for rows, step in ((x, False), (x[:1], False), (x, True)))
            (want,) = MatrixGroup(numba_m).run_experts(x, None, np.array([2]), np.array([0, 5]))
            ok &= same_bits(device_m.product(torch.from_numpy(x).to(device), 2).cpu(), want)
            if not ok:
                failed.append(f"{name} {n_rows}x{n_cols}")
    return failed


def functions_on_device(torch, device) -> list[str]:
    """ggml's float functions in torch on the device against the numba runtime's (the same bits): ggml's vector
    expf, libm's expf / logf (glibc's), SiLU with its leftovers, sigmoid, softmax with a sink and rms_norm, on inputs
    over their ranges, infinities, NaN and zeros included. The names of those that differ."""
    from numba import njit

    from ggtools.runtime.kernels import ggmlmath, ops
    from ggtools.runtime.torch_backend import ggml_math as gm

    @njit
    def scalar_map(f, x, out):
        for i in range(x.size):
            out[i] = f(x[i])

    @njit
    def exp_of(v):
        return np.exp(v)

    @njit
    def log_of(v):
        return np.log(v)

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200_000) * 10, rng.uniform(-104, 89, 100_000),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, -103.97, 1e-30]]).astype(np.float32)
    positive = np.concatenate([np.abs(x) + np.float32(1e-3), np.float32(1e-41) * np.arange(1, 100),
                               [0.0, 1.0, np.inf, -1.0]]).astype(np.float32)
    on = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    failed = []
    for name, f, numba_f, values in (("v_expf", gm.v_expf, ggmlmath.expf, x), ("expf", gm.expf, exp_of, x),
                                     ("logf", gm.logf, log_of, positive)):
        want = np.empty_like(values)
        scalar_map(numba_f, values, want)
        if not same_bits(f(on(values)).cpu(), want):
            failed.append(name)
    rows = x[:200_000].reshape(-1, 100)      # 100 per row: 12 blocks of 8 and 4 leftovers
    want = np.empty_like(rows)
    for name, f, numba_rows in (("silu", gm.silu, ops.silu_rows), ("sigmoid", gm.sigmoid, ops.sigmoid_rows)):
        numba_rows(rows, want)
        if not same_bits(f(on(rows)).cpu(), want):
            failed.append(name)
    if not same_bits(gm.rms_norm(on(rows), on(np.ones(100, np.float32)), 1e-6).cpu(),
                     ops.rms_norm(rows, np.ones(100, np.float32), 1e-6)):
        failed.append("rms_norm")
    scores = (rows[:64] / 5).copy()
    scores[:, 90:] = -np.inf
    sinks = rng.standard_normal(64).astype(np.float32)
    for row, sink in zip(scores, sinks):
        ops.soft_max(row, want[0], sink)
        if not same_bits(gm.soft_max(on(row)[None], on(np.float32([sink]))).cpu()[0], want[0]):
            failed.append("soft_max")
            break
    return failed


def quantized_fixture_targets() -> list[tuple[str, str]]:
    """(name, path) of the fixture cache's quantized MoE and hybrid targets that are already built (a device
    machine usually cannot build them: no network)."""
    from scripts.fixtures.fixture_cache import cache_root
    found = []
    for unit, file in (("qwen35", "tiny-qwen35-Q8_0.gguf"), ("qwen3moe-target", "tiny-qwen3moe-Q8_0.gguf"),
                       ("gpt-oss-target", "tiny-gpt-oss-MXFP4_MOE.gguf"),
                       ("qwen35moe", "tiny-qwen35moe-MXFP4_MOE.gguf"),
                       ("kimi-k3", "tiny-kimi-k3-Q8_0-MXFP4.gguf")):
        paths = sorted(Path(cache_root(), "artifacts").glob(f"{unit}-*/{file}"))
        if paths:
            found.append((file.removesuffix(".gguf"), str(paths[-1])))
    return found


def draft_tree():
    """A DDTree of 22 nodes from random distributions (a chain and side branches)."""
    from ggtools.runtime.ddtree import build_tree, top_k_log_probs
    rng = np.random.default_rng(4)
    return build_tree(*top_k_log_probs((rng.standard_normal((7, 1000)) * 2).astype(np.float32), 4), 22)


def targets_against_numba(device, work: Path) -> dict:
    """{name: relative max |logit difference|} of targets in float32 on the device against numba (a prompt as
    one batch, then one-token steps, then a draft tree's rows after it), and whether each was bit for bit."""
    from ggtools.jobs.demo import demo_data
    from ggtools.jobs.quantize import plan_quantize, quantize
    from ggtools.runtime import TargetModel
    demo = str(demo_data() / "target.gguf")
    targets = [("demo F16", demo)]
    for scheme in ("q8_0", "q4_0", "q4_1", "q5_1"):
        out = work / f"target-{scheme}.gguf"
        quantize(plan_quantize(demo, str(out), scheme), force=True, progress=False)
        targets.append((f"demo {scheme.upper()}", str(out)))
    out = {}
    for name, path in targets + quantized_fixture_targets():
        numba, on_device = TargetModel(path, threads=1), TargetModel(path, backend="torch", device=device, dtype="f32")
        ids = [1] + np.random.default_rng(7).integers(3, min(numba.n_vocab, 1000), 31).tolist()
        diffs, equal = [], True
        for stepwise in (False, True):
            numba.kv.clear()
            on_device.kv.clear()
            want, got = numba.forward(ids, stepwise=stepwise)[0], on_device.forward(ids, stepwise=stepwise)[0]
            diffs.append(float(np.abs(got - want).max() / np.abs(want).max()))
            equal &= same_bits(got, want)
        tree = draft_tree()
        want, got = (model.forward([5] + [t + 3 for t in tree.tokens], stepwise=True, tree=tree.parents)[0]
                     for model in (numba, on_device))
        diffs.append(float(np.abs(got - want).max() / np.abs(want).max()))
        out[name] = {"rel_logit_diff": max(diffs), "bit_for_bit": equal and same_bits(got, want),
                     "tree_bit_for_bit": same_bits(got, want)}
    return out


def demo_pair_f32_against_numba(device, target, drafters, prompts, n) -> dict:
    """The demo pair in float32 on the device: each drafter's speculative steps and tau against numba's."""
    from ggtools.runtime import Drafter, TargetModel, speculative_generate
    from ggtools.runtime.stats import acceptance_stats
    out = {}
    models = TargetModel(target, threads=1), TargetModel(target, backend="torch", device=device, dtype="f32")
    for name, path in drafters.items():
        runs = []
        for model in models:
            drafter = Drafter(path, model)
            kv = drafter.new_kv(ring_cap=64)
            steps = []
            for ids in prompts:
                steps.append(speculative_generate(model, drafter, kv, ids, n).steps)
                model.kv.clear()
            runs.append((steps, acceptance_stats(steps, drafter.block_size)["tau_zlab"]))
        out[name] = {"tau_numba": runs[0][1], "tau_device": runs[1][1], "same_steps": runs[0][0] == runs[1][0]}
    return out


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


def markdown(report, dtype) -> str:
    """The section of docs/benchmarks.md: the bit-for-bit checks, then each pair's speed in the compute dtype."""
    checks = [[what, "**not bit for bit: " + ", ".join(report[key]) + "**" if report[key] else "bit for bit"]
              for key, what in (("dequantizers_not_bit_exact", "dequantizers, every type"),
                                ("f32_products_not_bit_exact", "f32 products, every type and layout"),
                                ("f32_functions_not_bit_exact", "f32 ggml functions"))]
    checks += [[f"{name}, f32 logits against numba", f"{t['rel_logit_diff']:.2e} relative"
                + (" (bit for bit)" if t["bit_for_bit"] else "")] for name, t in report["f32_targets_against_numba"].items()]
    checks += [[f"demo pair {name}, f32 steps against numba", f"tau {p['tau_device']:.4f} / {p['tau_numba']:.4f}, steps "
                + ("equal" if p["same_steps"] else "**differ**")] for name, p in report["f32_demo_pair_against_numba"].items()]
    pairs = [[p["name"], f"{p['speculative_tok_s']:.1f}", f"{p['target_only_tok_s']:.1f}", f"{p['speedup']:.2f}x",
              f"{p['tau_zlab']:.3f}", f"{p['al']:.3f}", f"{p['verified_per_step']:.1f}",
              "yes" if p["outputs_match_greedy"] else "**no**"] for p in report["pairs"]]
    return (f"Device {report['device']}, compute dtype {dtype}.\n\n" + page.table(["check", "result"], checks)
            + "\n\n" + page.table(["pair", "speculative tok/s", "target-only tok/s", "speedup", "τ (z-lab)", "AL",
                                     "rows / step", "= greedy"], pairs))


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
    page.add_option(ap)
    args = ap.parse_args()
    torch = check_cuda(args.device)
    report = {"device": "cpu" if args.device == "cpu" else torch.cuda.get_device_name(torch.device(args.device)),
              "dtype": args.dtype}
    report["dequantizers_not_bit_exact"] = dequantizers_on_gpu(torch, args.device)
    report["f32_products_not_bit_exact"] = products_on_device(torch, args.device)
    report["f32_functions_not_bit_exact"] = functions_on_device(torch, args.device)
    with tempfile.TemporaryDirectory(prefix="ggtools-device-check-") as tmp:
        report["f32_targets_against_numba"] = targets_against_numba(args.device, Path(tmp))
        target, drafters, prompts = demo_pair(Path(tmp), args.prompts)
        report["f32_demo_pair_against_numba"] = demo_pair_f32_against_numba(args.device, target, drafters,
                                                                            prompts[:2], min(args.n, 32))
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
    # 1e-4: tests/test_torch_parity.py's PARITY (what float64 sums in another order may leave: float32 ulps)
    failed = report["dequantizers_not_bit_exact"] or report["f32_products_not_bit_exact"] or \
        report["f32_functions_not_bit_exact"] or \
        any(t["rel_logit_diff"] > 1e-4 for t in report["f32_targets_against_numba"].values()) or \
        not all(p["same_steps"] for p in report["f32_demo_pair_against_numba"].values()) or \
        not all(p["outputs_match_greedy"] for p in report["pairs"])
    if args.markdown:
        page.emit(args, "device_check", markdown(report, args.dtype))
    if args.json:
        print(json.dumps(report, indent=2))
    elif not page.prints_markdown(args):
        bad = report["dequantizers_not_bit_exact"]
        print(f"device {report['device']}, compute dtype {args.dtype}")
        print(f"dequantizers bit-exact on the device: {'NOT ' + ', '.join(bad) if bad else f'all {len(TYPES)} types'}")
        for key, what in (("f32_products_not_bit_exact", "f32 products (every type and layout)"),
                          ("f32_functions_not_bit_exact", "f32 ggml functions")):
            bad = report[key]
            print(f"{what} bit for bit with numba on the device: {'NOT ' + ', '.join(bad) if bad else 'yes'}")
        for name, t in report["f32_targets_against_numba"].items():
            print(f"{name}, f32 on the device against numba: max |logit diff| {t['rel_logit_diff']:.2e} relative"
                  f"{' (bit for bit)' if t['bit_for_bit'] else ''}")
        for name, p in report["f32_demo_pair_against_numba"].items():
            print(f"demo pair {name}, f32 on the device: tau {p['tau_device']:.4f}, numba {p['tau_numba']:.4f}, "
                  f"steps {'equal' if p['same_steps'] else 'DIFFER'}")
        for p in report["pairs"]:
            print(f"{p['name']}: speculative {p['speculative_tok_s']:.1f} tok/s, target-only "
                  f"{p['target_only_tok_s']:.1f} tok/s, speedup {p['speedup']:.2f}x, tau {p['tau_zlab']:.3f}, AL "
                  f"{p['al']:.3f}, {p['verified_per_step']:.1f} rows/step, outputs "
                  f"{'equal' if p['outputs_match_greedy'] else 'DIFFER from'} greedy ({p['seconds']:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
