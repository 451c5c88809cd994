import sys

import click
from tqdm import tqdm

from ggtools.cli.backend_options import backend_options, runs_on
from ggtools.cli.draft_options import draft_options, draft_options_given, draft_setup, tree_options
from ggtools.cli.params import Count, FiniteFloatRange
from ggtools.cli.render import emit_json, human_bytes
from ggtools.cli.sampling_options import sampling_options, sampling_setup
from ggtools.jobs.run import DEFINITIONS, MTP, pair_warnings, run, run_speculative

MAX_TOKEN_ID = 2 ** 31 - 1  # llama_token is int32


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter("expected integers separated by commas or spaces", param_hint="--prompt-ids")
    if not ids:
        raise click.BadParameter("no token ids", param_hint="--prompt-ids")
    bad = next((i for i in ids if not 0 <= i <= MAX_TOKEN_ID), None)
    if bad is not None:
        raise click.BadParameter(f"token id {bad} is outside 0..{MAX_TOKEN_ID}", param_hint="--prompt-ids")
    return ids


class DraftPath(click.Path):
    """An existing drafter file, or `mtp` (the target's own nextn block)."""

    def __init__(self):
        super().__init__(exists=True, dir_okay=False)

    def convert(self, value, param, ctx):
        return MTP if value == MTP else super().convert(value, param, ctx)


def _progress_bar(total, as_json):
    """A bar of generated tokens on a terminal (long generations), else nothing."""
    return tqdm(total=total, unit="tok", desc="generate", leave=False, disable=as_json or not sys.stderr.isatty())


@click.command("run")
@click.option("--target", required=True, type=click.Path(exists=True, dir_okay=False), help="Target GGUF (first shard of a split model).")
@click.option("--draft", type=DraftPath(), metavar="GGUF|mtp",
              help="Drafter GGUF: DFlash / DFlash2 / DSpark (llama.cpp or lucebox profile), EAGLE3, or an MTP "
                   "sidecar; 'mtp': the target's own MTP (nextn) block (a file named mtp: ./mtp). Decode "
                   "speculatively.")
@click.option("--prompt", help="Prompt text, tokenized with the GGUF's own vocabulary (special tokens parsed).")
@click.option("--prompt-ids", help="Prompt as token ids, e.g. '1,415,2936' (any vocabulary).")
@click.option("-n", "--n-predict", "n", default=64, show_default=True, type=Count(min=0), help="Tokens to generate.")
@draft_options
@tree_options(many=False)
@sampling_options(many=False)
@click.option("--min-acceptance", type=FiniteFloatRange(0, 1), help="Exit 1 when acceptance (accepted/drafted) is below this.")
@click.option("--no-baseline", is_flag=True, help="Skip target-only decoding (no speedup, no output check).")
@click.option("--threads", type=Count(min=1), help="CPU threads (default: all cores; at most 4 per core).")
@click.option("--context-length", "n_ctx", type=Count(min=1),
              help="Allow prompt + -n up to this many tokens (default: the target's context_length).")
@backend_options
@click.option("--ignore-eos", is_flag=True, help="Do not stop at an end-of-generation token.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(target, draft, prompt, prompt_ids, n, ring_cap, full_kv, n_max, cut, p_min, n_min, tree_budget, tree_top_k,
            temp, seed, min_acceptance, no_baseline, threads, n_ctx, backend, device, dtype, ignore_eos, as_json,
            **chain):
    """Continue a prompt with a target model, greedily or sampled (--temp), alone or drafted by a DFlash, DSpark,
    EAGLE3 or MTP drafter; report speed, memory and (with --draft) acceptance. numba runs it on the CPU (the
    default); --backend torch on the CPU or a CUDA GPU (--device cuda).

    With --draft the output equals target-only decoding (checked against it, unless --no-baseline): greedy, or at
    --temp T > 0 sampled with llama.cpp's sampler chain and seed, a draft accepted while the target's draw equals
    it (llama.cpp's rule); every acceptance statistic is printed with its definition, and at T > 0 the expected
    acceptance too. Exit 1 when the outputs differ or the acceptance is below --min-acceptance.

    \b
    Examples:
      ggtools run --target SmolLM2-135M-Instruct.Q4_1.gguf --prompt 'Once upon a time' -n 32
      ggtools run --target tiny-qwen3-f16.gguf --prompt-ids 1,415,2936 --json
      ggtools run --target target.gguf --draft drafter-q8_0.gguf --prompt 'def main():' --ring-cap 512
      ggtools run --target target.gguf --draft drafter.gguf --prompt-ids 1,2,3 --cut margin --p-min 0.35 \\
          --n-min 1 --min-acceptance 0.2
      ggtools run --target target.gguf --draft drafter.gguf --prompt 'def main():' --backend torch --device cuda
      ggtools run --target target.gguf --draft dspark.gguf --prompt 'def main():' --cut confidence --p-min 0.5
      ggtools run --target target.gguf --draft drafter.gguf --prompt 'def main():' --tree-budget 22
      ggtools run --target qwen35-with-mtp.gguf --draft mtp --prompt 'def main():' --n-max 3
      ggtools run --target qwen3.gguf --draft eagle3.gguf --prompt 'def main():' --cut prob --p-min 0.2
      ggtools run --target target.gguf --draft drafter.gguf --prompt 'def main():' --temp 0.8 --seed 42
    """
    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt and --prompt-ids")
    ids = _parse_ids(prompt_ids) if prompt_ids is not None else None
    if seed is not None and temp == 0:
        raise click.UsageError("--seed needs --temp above 0: at temperature 0 decoding is greedy and draws nothing")
    sampling = dict(temp=temp, sampling=sampling_setup([temp], **chain), seed=seed)
    if draft is None:
        if draft_options_given(ring_cap, full_kv, n_max, cut, tree_budget, tree_top_k) or min_acceptance is not None:
            raise click.UsageError("--ring-cap, --full-kv, --n-max, --cut, --tree-budget, --tree-top-k and "
                                   "--min-acceptance need --draft")
        with _progress_bar(n, as_json) as bar:
            result = run(target, prompt=prompt, prompt_ids=ids, n=n, threads=threads, stop_at_eog=not ignore_eos,
                         n_ctx=n_ctx, progress=bar.update, backend=backend, device=device, dtype=dtype, **sampling)
        _show_target_only(result, as_json)
        return
    ring_cap, settings = draft_setup(ring_cap, full_kv, n_max, cut, p_min, n_min, tree_budget, tree_top_k)
    warnings = pair_warnings(target)
    if not as_json:
        for w in warnings:
            click.echo(f"warning: {w}", err=True)
    with _progress_bar(n * (1 if no_baseline else 2), as_json) as bar:
        result = run_speculative(target, draft, [prompt if ids is None else ids], n, ring_cap=ring_cap,
                                 settings=settings, threads=threads, stop_at_eog=not ignore_eos,
                                 compare=not no_baseline, n_ctx=n_ctx, progress=bar.update, backend=backend,
                                 device=device, dtype=dtype, **sampling)
    failures = _failures(result, min_acceptance, no_baseline)
    if as_json:
        if failures:
            click.echo(f"error: {'; '.join(failures)}", err=True)
        emit_json(result.to_dict() | {"failures": failures, "exit_code": 1 if failures else 0,
                                      "error": "; ".join(failures) or None, "warnings": warnings})
    else:
        _show_speculative(result, failures)
    sys.exit(1 if failures else 0)


def _failures(result, min_acceptance, no_baseline) -> list[str]:
    out = []
    if not no_baseline and not result.outputs_match_target:
        out.append(f"speculative output differs from target-only {decoding(result)}")
    if min_acceptance is not None and result.acceptance_rate < min_acceptance:
        out.append(f"acceptance {result.acceptance_rate:.3f} is below --min-acceptance {min_acceptance}")
    return out


def _show_target_only(result, as_json):
    if as_json:
        emit_json(result.to_dict())
        return
    click.echo(result.text if result.text is not None else " ".join(map(str, result.generated_ids)))
    click.echo(f"prompt: {len(result.prompt_ids)} tokens, {result.prompt_tokens_per_second:.1f} tok/s", err=True)
    click.echo(f"generation: {len(result.generated_ids)} tokens ({result.stop}), "
               f"{result.generate_tokens_per_second:.1f} tok/s", err=True)
    click.echo(f"memory: RSS {human_bytes(result.rss_bytes)}, peak {human_bytes(result.peak_rss_bytes)}; "
               f"{runs_on(result)}", err=True)
    click.echo(f"decoding: {decoding(result)}", err=True)


def _show_speculative(r, failures):
    click.echo(r.texts[0] if r.texts else " ".join(map(str, r.outputs[0])))
    err = lambda line: click.echo(line, err=True)  # noqa: E731
    verify = (f"cut {r.settings['cut']} (p_min {r.settings['p_min']}, n_min {r.settings['n_min']})"
              if r.settings["tree_budget"] is None else
              f"draft tree of {r.settings['tree_budget']} nodes, top-K {r.settings['tree_top_k']} (DDTree: 'drafted' "
              "counts its nodes)")
    err(f"drafter: {r.draft} ({r.profile} profile, {r.drafter_kind}), draft KV {r.draft_kv}, "
        f"n_max {r.settings['n_max']}, {verify}; {runs_on(r)}; {decoding(r)}")
    for name, value in r.stats.items():
        shown = "[" + ", ".join(f"{v:.3f}" for v in value) + "]" if isinstance(value, list) else (
            f"{value:.4f}" if isinstance(value, float) else str(value))
        err(f"  {name} = {shown}    ({DEFINITIONS[name]})")
    if r.target_only_tokens_per_second:
        err(f"  speed: speculative {r.speculative_tokens_per_second:.1f} tok/s, target-only "
            f"{r.target_only_tokens_per_second:.1f} tok/s, speedup {r.speedup:.2f}x (same prompts, same run; "
            f"drafting {100 * r.draft_seconds_share:.0f}% of the speculative time)")
    else:
        err(f"  speed: speculative {r.speculative_tokens_per_second:.1f} tok/s (no target-only baseline)")
    err(f"  draft KV: {human_bytes(r.draft_kv_bytes)} ({r.draft_kv}); a full draft KV for this sequence: "
        f"{human_bytes(r.draft_kv_bytes_full)}")
    if r.target_only_tokens_per_second:
        err(f"  output {'equals' if r.outputs_match_target else 'DIFFERS from'} target-only {decoding(r)}")
    for f in failures:
        err(f"FAIL: {f}")


def decoding(result) -> str:
    """How the tokens were chosen: greedy, or the sampler chain and its seed (to replay the run)."""
    if result.sampling is None:
        return "greedy decoding"
    return f"sampled decoding ({result.sampling['chain']}; replay with --seed {result.sampling['seed']})"
