import sys

import click

from ggtools.cli.backend_options import backend_options
from ggtools.cli.draft_options import draft_options, draft_setup, tree_options
from ggtools.cli.params import Count, FiniteFloatRange
from ggtools.cli.render import emit_json, table
from ggtools.cli.sampling_options import sampling_options, sampling_setup, temperature_list
from ggtools.gguf.outputs import same_file
from ggtools.jobs.accept import DEFAULT_MAX_DROP, accept, input_files
from ggtools.jobs.accept_plot import check_plot_path, write_plot
from ggtools.jobs.accept_report import (ALIGN, TEMP_ALIGN, TEMP_HEADERS, TREE_ALIGN, TREE_HEADERS, by_temperature,
                                        check_destination, definition_lines, failure_lines, setting_line,
                                        summary_headers, summary_rows, temperature_definition_lines, temperature_rows,
                                        tree_definition_lines, tree_rows, verdict_line, write_markdown)


@click.command("accept")
@click.option("--target", required=True, type=click.Path(), metavar="GGUF",
              help="Target GGUF (first shard of a split model).")
@click.option("--draft", "drafts", multiple=True, required=True, type=click.Path(), metavar="GGUF|DIR|mtp",
              help="Drafter GGUF (DFlash, DFlash2, DSpark, EAGLE3, an MTP sidecar), an HF DFlash / DSpark / EAGLE3 "
                   "checkpoint directory (converted on the fly, llama.cpp profile, into a temporary file), or 'mtp': "
                   "the target's own MTP block (a file named mtp: ./mtp). Repeat for each variant.")
@click.option("--prompts", type=click.Path(), metavar="FILE", help="Prompts: JSONL ({\"prompt\": ...} or {\"prompt_ids\": [...]}, optional \"id\") or "
              "plain text, one prompt per blank-line-separated paragraph (default: the built-in set of 12).")
@click.option("-n", "--n-predict", "n", default=64, show_default=True, type=Count(min=2),
              help="New tokens per prompt (each prompt plus -n must fit the target's context length).")
@click.option("--baseline", type=click.Path(), metavar="DRAFT", help="The drafter the others are compared with (default: the first --draft).")
@click.option("--max-drop", default=DEFAULT_MAX_DROP, show_default=True, type=FiniteFloatRange(0, 1, max_open=True),
              help="Fail a drafter of the baseline's family whose tau falls more than this (relative) below the "
                   "baseline's.")
@click.option("--min-tau", type=FiniteFloatRange(min=0), help="Fail a drafter whose tau is below this.")
@click.option("--min-acceptance", type=FiniteFloatRange(0, 1),
              help="Fail a drafter whose acceptance (accepted drafts / drafted) is below this, as run's gate.")
@draft_options
@tree_options(many=True)
@sampling_options(many=True)
@click.option("--threads", type=Count(min=1), help="CPU threads (default: all cores; at most 4 per core).")
@backend_options
@click.option("--ignore-eos", is_flag=True, help="Do not stop at an end-of-generation token.")
@click.option("--json", "as_json", is_flag=True, help="Every field as JSON on stdout (docs/accept.md).")
@click.option("--report", type=click.Path(dir_okay=False), help="Also write the report as Markdown (CI job summary).")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also write a figure (.png or .svg; needs ggtools[plot]).")
@click.option("--force", is_flag=True, help="Overwrite an existing --report or --plot file.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def command(target, drafts, prompts, n, baseline, max_drop, min_tau, min_acceptance, ring_cap, full_kv, n_max, cut, p_min, n_min,
            tree_budgets, tree_top_k, temps, seed, seeds, threads, backend, device, dtype, ignore_eos, as_json, report,
            plot, force, quiet, **chain):
    """Acceptance gate: decode a prompt set with each drafter (DFlash, DSpark, EAGLE3, MTP side by side) against
    the target and judge every drafter against a baseline. Every output is checked against target-only greedy
    decoding, which runs once per prompt for all drafters.

    With --temp T,T..., each drafter is measured at each temperature: greedy at 0, sampled with --seeds N seeds
    above 0 (llama.cpp's sampler chain; a draft accepted while the target's draw equals it), every output checked
    against target-only sampled decoding with the same seed; tau and acceptance are reported as mean and min..max
    over the seeds, beside the expected acceptance under llama.cpp's exact-match rule and under rejection sampling.

    Exit 1, naming each failing drafter and the number that failed, when a drafter's tau (z-lab's) falls more
    than --max-drop below the baseline's (at the same temperature; drafters of the baseline's family: another
    family's tau is shown beside it, not gated), is below --min-tau, its acceptance is below --min-acceptance, or
    its output differs from target-only decoding; exit 2 for bad input.

    \b
    Examples:
      ggtools accept --target target.gguf --draft drafter-f16.gguf --draft drafter-q8_0.gguf --draft drafter-q2_k.gguf
      ggtools accept --target target.gguf --draft hf-drafter/ --draft drafter-q4-mix.gguf --prompts prompts.jsonl \\
          --min-tau 2 --report summary.md --plot acceptance.png
      ggtools accept --target target.gguf --draft a.gguf --draft b.gguf --baseline b.gguf --full-kv --json
      ggtools accept --target target.gguf --draft drafter-f16.gguf --draft drafter-q4-mix.gguf --backend torch \\
          --device cuda:0 --dtype bf16
      ggtools accept --target target.gguf --draft drafter.gguf --draft dspark.gguf --tree-budget 4,22,64
      ggtools accept --target qwen35.gguf --draft dflash.gguf --draft dspark.gguf --draft eagle3.gguf --draft mtp
      ggtools accept --target target.gguf --draft a.gguf --draft b.gguf --temp 0,0.6,1.0 --seeds 3 --seed 42
    """
    if tree_top_k is not None and not tree_budgets:
        raise click.UsageError("--tree-top-k needs --tree-budget")
    ring_cap, settings = draft_setup(ring_cap, full_kv, n_max, cut, p_min, n_min, tree_top_k=tree_top_k)
    temps = temperature_list(temps)
    sampling = sampling_setup(temps, **chain)
    inputs = input_files(target, drafts, prompts)
    if report:
        check_destination(report, "--report", inputs, force=force)
    if report and plot and same_file(report, plot):
        raise click.UsageError(f"--report and --plot name the same file {plot}: give each its own")
    if plot:
        check_plot_path(plot, inputs, force=force)
    result = accept(target, list(drafts), prompts=prompts, n=n, baseline=baseline, max_drop=max_drop, min_tau=min_tau,
                    min_acceptance=min_acceptance, ring_cap=ring_cap, settings=settings, threads=threads,
                    stop_at_eog=not ignore_eos, progress=not quiet, backend=backend, device=device, dtype=dtype,
                    tree_budgets=tree_budgets or [], temps=temps, seeds=seeds, seed=seed, sampling=sampling)
    if report:
        write_markdown(result, report, inputs, force=force)
    if plot:
        write_plot(result, plot, inputs, force=force)
    if as_json:
        if result.exit_code:
            click.echo(f"error: {result.error}", err=True)
        emit_json(result.to_dict())
    else:
        _show(result)
    sys.exit(result.exit_code)


def _show(result):
    click.echo(setting_line(result))
    click.echo()
    click.echo(table(summary_rows(result), summary_headers(result), ALIGN))
    click.echo()
    if by_temperature(result):
        click.echo("By temperature (τ and acceptance: mean over the seeds, min..max):")
        click.echo(table(temperature_rows(result), TEMP_HEADERS, TEMP_ALIGN))
        click.echo()
    if result.tree_budgets:
        click.echo("Draft tree (DDTree) beside each drafter's chain:")
        click.echo(table(tree_rows(result), TREE_HEADERS, TREE_ALIGN))
        click.echo()
    for line in definition_lines(result) + (temperature_definition_lines() if by_temperature(result) else []) + (
            tree_definition_lines() if result.tree_budgets else []):
        click.echo(f"  {line}")
    click.echo()
    for line in failure_lines(result):
        click.echo(f"FAIL: {line}", err=True)
    click.echo(verdict_line(result), err=bool(result.failed))

