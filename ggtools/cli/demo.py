import contextlib
import os
import sys

import click

from ggtools.cli.backend_options import backend_options
from ggtools.cli.params import Count
from ggtools.cli.plan_view import show_plan
from ggtools.cli.render import emit_json, human_bytes, table
from ggtools.gguf.outputs import temporary_directory
from ggtools.jobs.demo import MTP_TARGET, SAMPLED, check_request, check_work_dir, requant_demo, run_demo


@click.command("demo")
@click.option("--work-dir", type=click.Path(file_okay=False),
              help="Keep the demo files here, in drafter/, moe/ and moe-q4k/ (default: a temporary directory, "
                   "removed at the end).")
@click.option("--force", is_flag=True, help="Replace the files of an earlier demo in --work-dir.")
@click.option("--prompts", default=6, show_default=True, type=Count(1, 36), help="Held-out prompts to decode.")
@click.option("-n", "--n-predict", "n", default=64, show_default=True, type=Count(1),
              help="Tokens per prompt (the 128-token prompts plus -n must fit the demo target's context of 512).")
@click.option("--ring-cap", default=64, show_default=True, type=Count(1), help="Draft KV ring slots.")
@click.option("--threads", default=1, show_default=True, type=Count(1),
              help="CPU threads (the demo models are tiny: one thread is the fastest target-only baseline; at most 4 "
                   "per core).")
@backend_options
@click.option("--rounds", default=2, show_default=True, type=Count(1), help="Runs per variant (best kept).")
@click.option("--skip-requant", is_flag=True, help="Leave out the second part (requant-trunk on a sample MoE set).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report of both parts (\"requant\": null "
                                                     "with --skip-requant).")
def command(work_dir, force, prompts, n, ring_cap, threads, backend, device, dtype, rounds, skip_requant, as_json):
    """Run the main jobs end to end on the embedded demo pair, with no downloads.

    \b
    1. The embedded DFlash drafter (HF format) is converted for its embedded qwen3 target (llama.cpp
       profile), quantized (q8_0, q4-mix, q2_k), validated and pair-checked, beside the embedded DSpark and
       EAGLE3 drafters; each variant then decodes held-out prompts speculatively with the draft-KV ring (EAGLE3:
       its whole KV), against target-only decoding in the same run; the f16 drafter also sampled (T 0.8, seed
       42), against target-only sampled decoding with that seed; and an embedded Qwen3.5 target drafts with its
       own MTP block.
    2. requant-trunk on a small Kimi-like MoE shard set (Q8_0 trunk -> Q4_K, experts byte-copied).

    Exit 1 if a check fails or a speculative output differs from target-only decoding.
    """
    say = (lambda line: None) if as_json else click.echo
    check_request(n, threads, ring_cap, device if backend == "torch" else None)
    if work_dir:
        check_work_dir(work_dir, force)
    with contextlib.nullcontext(work_dir) if work_dir else temporary_directory("ggtools-demo-") as root:
        say("1. DFlash drafter: convert, quantize, check, decode speculatively")
        report = run_demo(os.path.join(root, "drafter"), prompts=prompts, n=n, ring_cap=ring_cap, threads=threads,
                          rounds=rounds, log=lambda line: say("   " + line), backend=backend, device=device,
                          dtype=dtype, force=force)
        if not as_json:
            _show_table(report)
        requant = None if skip_requant else requant_demo(
            root, log=say, show_plan=(lambda plan: None) if as_json else lambda plan: show_plan(plan, tensors=False),
            force=force)
        if as_json:
            emit_json({"work_dir": report.work_dir, "prompts": report.prompts, "rounds": report.rounds,
                       "target_only_tokens_per_second": report.target_tokens_per_second,
                       "variants": [{"name": v.name, "path": v.path, "bytes": v.bytes, "checks": v.checks,
                                     "speedup": v.speedup, "run": v.run.to_dict()} for v in report.variants],
                       "requant": requant.to_dict() if requant else None})
        if requant and requant.exit_code:
            sys.exit(requant.exit_code)
    if not report.all_match:
        click.echo("FAIL: a speculative output differs from target-only decoding", err=True)
        sys.exit(1)


def _show_table(report):
    rows = []
    for v in report.variants:
        r = v.run
        rows.append([v.name, human_bytes(v.bytes), f"{r.acceptance_rate:.3f}", f"{r.stats['tau_zlab']:.2f}",
                     f"{r.stats['mean_accepted_length_incl_bonus']:.2f}", f"{r.speculative_tokens_per_second:.0f}",
                     f"{v.speedup:.2f}x", f"{human_bytes(r.draft_kv_bytes)} ({r.draft_kv})",
                     "yes" if r.outputs_match_target else "NO"])
    click.echo()
    click.echo(table(rows, ["drafter", "file", "acceptance", "tau", "mean len", "tok/s", "speedup", "draft KV",
                            "= target"], "llrrrrrll"))
    first = report.variants[0].run
    click.echo(f"\n   prompts: {', '.join(report.prompts)} ({first.prompts} windows of 128 tokens from stdlib modules the "
               f"pair never trained on, up to {max(len(o) for o in first.outputs)} new tokens each)")
    click.echo("   acceptance = accepted drafts / drafted; tau = z-lab's mean accepted length incl. the bonus, "
               "averaged per sequence;\n   mean len = 1 + accepted / steps (llama.cpp); speedup = speculative tok/s / "
               f"{report.target_tokens_per_second:.0f} tok/s, the fastest target-only\n   decoding of the same prompts in "
               f"this run (best of {report.rounds} rounds each); draft KV = the drafter's K/V memory (a full\n   draft "
               f"KV holds {human_bytes(first.draft_kv_bytes_full)} for the longest sequence).")
    click.echo("   = target: every output equals target-only decoding of the same prompts: greedy, or for "
               f"f16, T {SAMPLED[0]:g}, sampled\n   with llama.cpp's chain and seed {SAMPLED[1]} (a draft accepted "
               "while the target's draw equals it; its speedup is over\n   target-only sampled decoding). The mtp "
               f"row is {MTP_TARGET}, a Qwen3.5 target with a trained MTP block, drafting\n   with its own block "
               "(its speedup over its own target-only decoding).")
    click.echo("   The demo target (1.25 M parameters) sits in the CPU cache, so every verified row costs arithmetic\n"
               "   instead of sharing one weight read: expect speedups on targets whose step is bound by weight\n"
               "   bandwidth (docs/speculative.md), not here.\n")
