import click

from ggtools.cli.doctor import show_report
from ggtools.jobs.doctor import pair_check


@click.command("pair-check")
@click.argument("target", type=click.Path(exists=True, dir_okay=False))
@click.argument("draft", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def command(target, draft, as_json):
    """Check a DFlash drafter GGUF against its target GGUF: `ggtools doctor DRAFT --target TARGET`, under its old
    name. The rules of the drafter's runtime (llama.cpp for arch dflash, lucebox for qwen35-dflash-draft) and of
    ggtools' own: required keys and tensors, mask id, target layers, fc width, hidden sizes, block size, DFlash2
    lattice, target arch. Each failure shows what the runtime would say and the fix.

    Exit 0: the pair works; 1: a check failed or could not be made; 2: unreadable input.

    \b
    Examples:
      ggtools pair-check Qwen3-8B-Q8_0.gguf dflash.gguf
      ggtools pair-check Qwen3.5-27B-00001-of-00002.gguf draft-lucebox.gguf --json
    """
    show_report(pair_check(target, draft), as_json, ok_line="pair OK")
