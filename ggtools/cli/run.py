import click

from ggtools.cli.render import emit_json, human_bytes
from ggtools.runtime.generate import run


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter("expected integers separated by commas or spaces", param_hint="--prompt-ids")


@click.command("run")
@click.option("--target", required=True, type=click.Path(exists=True, dir_okay=False), help="Target GGUF (first shard of a split model).")
@click.option("--prompt", help="Prompt text, tokenized with the GGUF's own vocabulary (special tokens parsed).")
@click.option("--prompt-ids", help="Prompt as token ids, e.g. '1,415,2936' (any vocabulary).")
@click.option("-n", "--n-predict", "n", default=64, show_default=True, type=click.IntRange(min=0), help="Tokens to generate.")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at an end-of-generation token.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(target, prompt, prompt_ids, n, threads, ignore_eos, as_json):
    """Greedily continue a prompt with a target model on the CPU; report speed and memory.

    \b
    Examples:
      ggtools run --target SmolLM2-135M-Instruct.Q4_1.gguf --prompt 'Once upon a time' -n 32
      ggtools run --target tiny-qwen3-f16.gguf --prompt-ids 1,415,2936 --json
    """
    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt and --prompt-ids")
    result = run(target, prompt=prompt, prompt_ids=_parse_ids(prompt_ids) if prompt_ids is not None else None,
                 n=n, threads=threads, stop_at_eog=not ignore_eos)
    if as_json:
        emit_json(result.to_dict())
        return
    click.echo(result.text if result.text is not None else " ".join(map(str, result.generated_ids)))
    click.echo(f"prompt: {len(result.prompt_ids)} tokens, {result.prompt_tokens_per_second:.1f} tok/s", err=True)
    click.echo(f"generation: {len(result.generated_ids)} tokens ({result.stop}), "
               f"{result.generate_tokens_per_second:.1f} tok/s", err=True)
    click.echo(f"memory: RSS {human_bytes(result.rss_bytes)}, peak {human_bytes(result.peak_rss_bytes)}; "
               f"threads {result.threads}", err=True)
