import os

import click

from ggtools.cli.plan_view import show_plan, warn_nonfinite
from ggtools.cli.render import emit_json, human_bytes
from ggtools.jobs.quantize import SCHEMES, plan_quantize, quantize


@click.command("quantize")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(), help="Output file (for a shard set: a directory).")
@click.option("--scheme", required=True, help=f"{', '.join(SCHEMES)}, or any ggml type as a pure scheme (q4_k, q6_k, f16...).")
@click.option("--tensor-type", "overrides", multiple=True, metavar="REGEX=TYPE",
              help="Per-tensor type; the first matching pattern wins (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("-j", "--jobs", type=click.IntRange(1), default=1, show_default=True, help="Shards in parallel.")
@click.option("--allow-nonfinite", is_flag=True, help="Write NaN/inf source values and NaN/inf scales (counted and "
              "reported) instead of refusing the tensor.")
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan / result.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def command(path, out, scheme, overrides, dry_run, jobs, allow_nonfinite, force, as_json, quiet):
    """Quantize a GGUF (drafter or model) with a scheme and per-tensor overrides, bit-exact with
    llama-quantize's reference quantizers. Norms, 1-D tensors and routers are never quantized; rows that do
    not fit a type take llama-quantize's fallback.

    \b
    Schemes:
      q8_0    every quantizable weight Q8_0
      q4-mix  drafter heads (fc, selector, dflash.*) Q8_0, blk.* weights Q4_0
      q2_k    drafter heads Q8_0, blk.* weights Q2_K
      TYPE    one ggml type everywhere (q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k f16 bf16 f32)
    \b
    Examples:
      ggtools quantize drafter-f16.gguf -o drafter-q8_0.gguf --scheme q8_0
      ggtools quantize drafter-f16.gguf -o drafter-q2k.gguf --scheme q2_k --tensor-type 'attn_v=q4_k' --dry-run
    """
    plan = plan_quantize(path, out, scheme, overrides)
    if dry_run:
        show_plan(plan, as_json=as_json, tensors=not quiet)
        return
    report = quantize(plan, jobs=jobs, force=force, allow_nonfinite=allow_nonfinite,
                      progress=False if quiet or as_json else None)
    if as_json:
        emit_json({"written": report.done, "bytes_in": plan.bytes_in, "bytes_out": plan.bytes_out,
                   "nonfinite": report.nonfinite})
        return
    warn_nonfinite(report)
    click.echo(f"wrote {', '.join(os.path.basename(p) for p in report.done)}: {human_bytes(plan.bytes_in)} -> "
               f"{human_bytes(plan.bytes_out)} (verified)")
