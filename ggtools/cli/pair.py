import sys

import click

from ggtools.cli.render import emit_json
from ggtools.jobs.pair import pair_check

MARK = {"ok": "ok  ", "warning": "WARN", "error": "FAIL"}


@click.command("pair-check")
@click.argument("target", type=click.Path(exists=True, dir_okay=False))
@click.argument("draft", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def command(target, draft, as_json):
    """Check a DFlash drafter GGUF against its target GGUF, with the rules of the drafter's runtime
    (llama.cpp for arch dflash, lucebox for qwen35-dflash-draft): required keys and tensors, mask id,
    target layers, fc width, hidden sizes, block size, DFlash2 lattice. Each failure shows the error the
    runtime would give and the fix.

    Exit 0: the pair works; 1: a check failed; 2: unreadable input.

    \b
    Examples:
      ggtools pair-check Qwen3-8B-Q8_0.gguf dflash.gguf
      ggtools pair-check Qwen3.5-27B-00001-of-00002.gguf draft-lucebox.gguf --json
    """
    show_pair_report(pair_check(target, draft), target, draft, as_json)


def show_pair_report(report, target, draft, as_json=False):
    """Print a pair report and exit with its code (shared with `validate --pair`)."""
    if report.exit_code:
        click.echo(f"error: {report.error}", err=True)
    if as_json:
        emit_json(report.as_dict())
        sys.exit(report.exit_code)
    click.echo(f"{draft} ({report.profile} profile) against {target}")
    for f in report.findings:
        click.echo(f"  {MARK[f.severity]} {f.check}: {f.message}")
        if f.severity != "ok":
            if f.loader_error:
                click.echo(f"       runtime says: \"{f.loader_error}\"")
            if f.fix:
                click.echo(f"       fix: {f.fix}")
    n = len(report.errors)
    click.echo("pair OK" if n == 0 else f"{n} check(s) failed")
    sys.exit(report.exit_code)
