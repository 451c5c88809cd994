#!/usr/bin/env python3
"""Draft tree (DDTree) against the chain on the demo target and its trained drafters, in one run: for each drafter
(the DFlash v1 demo drafter in f16 and q2_k, the DSpark drafters anchor-first and bonus-anchor) the chain and a tree
of each budget decode the same held-out prompts; per row: AL (mean accepted length incl. the bonus), τ, the verified
rows per step (1 + drafts or nodes), tok/s, and whether the output equals target-only greedy decoding (it must).

  python -m scripts.bench.ddtree [--prompts 36] [-n 128] [--budgets 1,4,8,16,22,32,64] [--threads 1]
                                 [--ring-cap 64] [--json] [--markdown [PAGE]]
"""

import argparse
import json
import tempfile
from pathlib import Path

from ggtools.jobs.accept import Candidate, measure
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.runtime import DraftSettings, TargetModel, Tokenizer
from scripts.bench import page


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=36)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--budgets", default="1,4,8,16,22,32,64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ring-cap", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    page.add_option(ap)
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    target_path = str(demo_data() / "target.gguf")
    with tempfile.TemporaryDirectory(prefix="ggtools-ddtree-") as work:
        paths = {v.name: v.path for v in build_drafters(work, target_path)}
        speculators = Path(work) / "dspark-speculators-f16.gguf"
        convert_dflash(demo_data() / "dspark-speculators", speculators, target=target_path, outtype="f16")
        drafters = {"dflash f16": paths["f16"], "dflash q2_k": paths["q2_k"], "dspark-anchor f16": paths["dspark f16"],
                    "dspark-speculators f16": str(speculators)}
        target = TargetModel(target_path, threads=args.threads)
        prompts = [ids for _, ids in held_out_prompts(Tokenizer.from_gguf(target.weights.meta), args.prompts)]
        m = measure(target, [Candidate(name, path, args.ring_cap) for name, path in drafters.items()], prompts, args.n,
                    settings=DraftSettings(), stop_ids=set(), tree_budgets=budgets)
        target.close()
    rows = []
    for name, chain, trees in zip(drafters, m.runs, m.trees):
        rows.append(_row(name, "chain", chain, m.target_tokens_per_second))
        rows += [_row(name, f"tree {b}", t, m.target_tokens_per_second) for b, t in zip(budgets, trees)]
    if args.json:
        print(json.dumps({"settings": vars(args), "target_only_tokens_per_second": m.target_tokens_per_second,
                          "rows": rows}, indent=1))
        return
    if args.markdown:
        page.emit(args, "ddtree", markdown(rows, len(prompts), args, m.target_tokens_per_second))
        if page.prints_markdown(args):
            return
    print(f"demo target, {len(prompts)} held-out prompts x {args.n} tokens, ring {args.ring_cap}, {args.threads} "
          f"thread(s); target-only {m.target_tokens_per_second:.0f} tok/s")
    print(f"{'drafter':24} {'verify':9} {'K':>2} {'AL':>6} {'tau':>6} {'rows/step':>9} {'tok/s':>6} "
          f"{'speedup':>7}  = greedy")
    for r in rows:
        print(f"{r['drafter']:24} {r['verify']:9} {r['top_k'] or '':>2} {r['al']:6.3f} {r['tau']:6.3f} "
              f"{r['verified_per_step']:9.2f} {r['tokens_per_second']:6.0f} {r['speedup']:6.2f}x  "
              f"{'yes' if r['equals_greedy'] else 'NO'}")


def markdown(rows, n_prompts, args, target_tps) -> str:
    return (f"Demo target, {n_prompts} held-out prompts x {args.n} tokens, ring {args.ring_cap}, {args.threads} "
            f"thread(s); target-only {target_tps:.0f} tok/s; AL = mean accepted length incl. the bonus, rows / step = "
            "the verify batch (1 + drafts or nodes):\n\n" + page.table(
                ["drafter", "verify", "top-K", "AL", "τ", "rows / step", "tok/s", "speedup", "= greedy"],
                [[r["drafter"], r["verify"], r["top_k"] or "", f"{r['al']:.3f}", f"{r['tau']:.3f}",
                  f"{r['verified_per_step']:.2f}", f"{r['tokens_per_second']:.0f}", f"{r['speedup']:.2f}x",
                  "yes" if r["equals_greedy"] else "**no**"] for r in rows]))


def _row(name, verify, run, target_tps):
    s = run.stats
    return {"drafter": name, "verify": verify, "top_k": run.settings["tree_top_k"],
            "al": s["mean_accepted_length_incl_bonus"], "tau": s["tau_zlab"],
            "verified_per_step": s["verified_per_step"],
            "acceptance_rate": s["acceptance_rate"], "tokens_per_second": run.speculative_tokens_per_second,
            "speedup": run.speculative_tokens_per_second / target_tps if target_tps else 0.0,
            "equals_greedy": run.outputs_match_target}


if __name__ == "__main__":
    main()
