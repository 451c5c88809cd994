import sys

import click

from ggtools.cli.render import emit_json, human_bytes
from ggtools.jobs.validate import validate


@click.command("validate")
@click.argument("paths", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--pair", nargs=2, metavar="TARGET DRAFT", type=click.Path(exists=True, dir_okay=False),
              help="Check a DFlash drafter against its target instead (same as `ggtools pair-check`).")
@click.option("--deep", is_flag=True, help="Also scan tensor data: finite fp16 scales and floats, MXFP4 exponents.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--write-manifest", type=click.Path(dir_okay=False), metavar="F",
              help="Write sha256 of every file and tensor to F (JSON).")
@click.option("--manifest", type=click.Path(exists=True, dir_okay=False), metavar="F",
              help="Check files against F: a ggtools manifest or sha256sum-style lines (e.g. HF LFS hashes).")
@click.option("-j", "--jobs", type=click.IntRange(1), help="Files checked in parallel (default: CPU count).")
@click.option("--force", is_flag=True, help="Let --write-manifest replace an existing file.")
def command(paths, pair, deep, as_json, write_manifest, manifest, jobs, force):
    """Check GGUF files and shard sets against every rule llama.cpp applies, and the ones it misses.

    Any one shard names its whole set. Exit 0: all good; 1: a check failed; 2: unreadable input.

    \b
    Examples:
      ggtools validate model.gguf
      ggtools validate --deep model-00001-of-00032.gguf
      ggtools validate --write-manifest model.sha256.json model-00001-of-00032.gguf
      ggtools validate --manifest model.sha256.json model-00001-of-00032.gguf
      ggtools validate --pair Qwen3-8B-Q8_0.gguf dflash-draft.gguf
    """
    if pair:
        from ggtools.cli.doctor import show_report
        from ggtools.jobs.doctor import pair_check
        show_report(pair_check(*pair), as_json, ok_line="pair OK")
    if not paths:
        raise click.UsageError("give at least one PATH (or --pair TARGET DRAFT)")
    if write_manifest and manifest:
        raise click.UsageError("--write-manifest and --manifest are exclusive")
    report = validate(paths, deep=deep, manifest=manifest, write_manifest=write_manifest, jobs=jobs, force=force)
    if as_json:
        emit_json(report.as_dict())
    else:
        for f in report.files:
            bad = [p for p in f.problems if p.severity == "error"]
            status = "UNREADABLE" if not f.readable else ("FAIL" if bad else "ok")
            click.echo(f"{status:10} {f.path} ({f.n_tensors} tensors, {human_bytes(f.size)})")
        for p in report.problems:
            click.echo(f"  {p.severity}: {p}")
        n_err = len(report.errors)
        click.echo(f"{len(report.files)} file(s) checked{', deep' if deep else ''}: "
                   + ("all good" if report.exit_code == 0 else f"{n_err} error(s)"))
        if write_manifest and report.exit_code != 2:
            click.echo(f"manifest written to {write_manifest}")
    if report.exit_code:
        click.echo(f"error: {report.error}", err=True)
    sys.exit(report.exit_code)
