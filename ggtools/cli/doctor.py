import sys

import click

from ggtools.cli.plan_view import show_plan
from ggtools.cli.render import emit_json
from ggtools.jobs.doctor import RUNTIMES, doctor, doctor_fix

PROFILE_NAMES = ("llama.cpp", "lucebox")
MARK = {"ok": "ok  ", "warning": "WARN", "error": "FAIL", "unchecked": "FAIL"}


@click.command("doctor")
@click.argument("draft", type=click.Path(exists=True, dir_okay=False))
@click.option("--target", type=click.Path(exists=True, dir_okay=False),
              help="The target GGUF (any shard): check the pair; --fix takes the tokenizer from it.")
@click.option("--hf", "hf", type=click.Path(exists=True, file_okay=False),
              help="The Hugging Face checkpoint the drafter came from: check every value and tensor against it; "
                   "--fix takes the values from it.")
@click.option("--runtime", "runtimes", multiple=True, type=click.Choice(RUNTIMES),
              help="Check for this runtime (repeatable). Default: the runtime whose layout the file is in: llama.cpp "
                   "for arch dflash, lucebox for qwen35-dflash-draft / dflash-draft / gemma4-dflash-draft, both for "
                   "any other arch; ggtools (the runtime of ggtools run and accept) only when named.")
@click.option("--n-max", type=click.IntRange(0), help="The draft size you run with (llama.cpp default 3).")
@click.option("--fix", is_flag=True, help="Write a repaired copy to -o: fixes only what the evidence supports, "
                                          "and writes nothing (exit 1, naming what is left) while a check would still "
                                          "fail.")
@click.option("--to", type=click.Choice(PROFILE_NAMES), help="With --fix: also move it to this layout.")
@click.option("-o", "--out", type=click.Path(dir_okay=False), help="Output GGUF for --fix.")
@click.option("--dry-run", is_flag=True, help="With --fix: print the plan, write nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def command(draft, target, hf, runtimes, n_max, fix, to, out, dry_run, force, as_json):
    """Find every known fault of a DFlash drafter GGUF: for each, its severity, the runtimes it breaks, what each
    shows (quoted as it prints it) and the command that fixes it. The file alone; with --hf every value and tensor
    against the checkpoint; with --target the target too and the pair (the same checks as pair-check).

    Whatever the runtimes checked (llama.cpp, lucebox, ggtools: see --runtime), the model-file rules apply to the
    drafter and the target: the container rules of ggtools validate (a cut file fails) and the hyperparameter rules
    ggtools run applies (types, ranges, NaN, the tensors' shapes), so doctor never passes a file ggtools run refuses
    for them.

    Exit 0: no failed check; 1: a check failed or could not be made (with --fix: nothing written); 2: unreadable
    input.

    \b
    Examples:
      ggtools doctor draft.gguf
      ggtools doctor draft.gguf --target Qwen3-8B-Q8_0.gguf --hf Qwen3-8B-DFlash-b16/ --json
      ggtools doctor draft.gguf --fix -o fixed.gguf                    # mask id kept under dflash.mask_token_id
      ggtools doctor lucebox-draft.gguf --hf drafter/ --fix --to llama.cpp --target T.gguf -o draft-llama.gguf
    """
    if not fix:
        if to or out or dry_run:
            raise click.UsageError("--to, -o and --dry-run go with --fix")
        show_report(doctor(draft, target=target, hf=hf, runtimes=runtimes, n_max=n_max), as_json)
        return
    if not out:
        raise click.UsageError("--fix needs -o OUT (the input is never modified)")
    result = doctor_fix(draft, out, target=target, hf=hf, to=to, runtimes=runtimes, n_max=n_max, force=force,
                        dry_run=dry_run)
    if as_json:
        if result.exit_code:
            click.echo(f"error: {result.error}", err=True)
        emit_json(result.as_dict())
        sys.exit(result.exit_code)
    show_report(result.before, exit_after=False)
    click.echo()
    if dry_run:
        show_plan(result.plan)
    for note in result.notes:
        click.echo(f"note: {note}")
    fixed = ", ".join(f"{k} = {v}" for k, v in result.fixed.items()) or "nothing (no value the evidence supports)"
    click.echo(f"{'would fix' if dry_run else 'fixed'}: {fixed}")
    if dry_run:
        return
    click.echo(f"wrote {out}; checked again:")
    show_report(result.after)


def show_report(report, as_json=False, *, exit_after=True, ok_line="OK"):
    """Print a doctor report and (by default) exit with its code; shared with pair-check and validate --pair.
    A failed report also gives its one error line on stderr (when it ends the command)."""
    if exit_after and report.exit_code:
        click.echo(f"error: {report.error}", err=True)
    if as_json:
        emit_json(report.as_dict())
        sys.exit(report.exit_code)
    given = "".join(f" {label} {v}" for label, v in (("against", report.target), ("from", report.hf)) if v)
    layout = f"{report.profile} layout" if report.profile else "not a DFlash drafter layout"
    click.echo(f"{report.draft} ({layout}; for {', '.join(report.runtimes)}){given}")
    for f in report.findings:
        click.echo(f"  {MARK[f.severity]} {f.check}: {f.message}")
        if f.severity == "ok":
            continue
        for e in f.effects:
            click.echo(f"       breaks {e}")
        if f.fix:
            click.echo(f"       fix: {f.fix}")
    n = len(report.errors)
    click.echo(ok_line if n == 0 else f"{n} check(s) failed")
    if exit_after:
        sys.exit(report.exit_code)
