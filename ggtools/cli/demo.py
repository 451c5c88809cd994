import os
import tempfile

import click

from ggtools.cli.plan_view import show_plan
from ggtools.cli.render import human_bytes
from ggtools.jobs.requant import plan_requant_trunk
from ggtools.jobs.validate import validate
from ggtools.samples import write_moe_set
from ggtools.shard_runner import run_plan


@click.command("demo")
@click.option("--work-dir", type=click.Path(file_okay=False), help="Keep the demo files here (default: a temp dir).")
def command(work_dir):
    """Run the main jobs end to end on an embedded default, with no downloads.

    Builds a small Kimi-like MoE shard set (MXFP4 experts, Q8_0 trunk, F32 norms), validates it,
    requantizes the trunk to Q4_K split-in = split-out with every copy verified, and validates the result.
    """
    with tempfile.TemporaryDirectory(prefix="ggtools-demo-") as tmp:
        root = work_dir or tmp
        src_dir, out_dir = os.path.join(root, "moe"), os.path.join(root, "moe-q4k")
        os.makedirs(src_dir, exist_ok=True)
        os.makedirs(out_dir, exist_ok=True)
        paths = write_moe_set(os.path.join(src_dir, "kimi-like"), force=True)
        click.echo(f"1. sample MoE shard set: {len(paths)} shards, "
                   f"{human_bytes(sum(os.path.getsize(p) for p in paths))} in {src_dir}")
        _validate(paths[0])
        plan = plan_requant_trunk(paths[0], out_dir)
        click.echo("2. requant-trunk plan (Q8_0 trunk -> Q4_K; MXFP4 experts and F32 norms byte-copied):")
        show_plan(plan, tensors=False)
        report = run_plan(plan, jobs=1, force=True, progress=False)
        click.echo(f"3. wrote and verified {len(report.done)} shards: {human_bytes(plan.bytes_in)} -> "
                   f"{human_bytes(plan.bytes_out)}")
        _validate(os.path.join(out_dir, os.path.basename(paths[0])))


def _validate(path):
    report = validate([path], deep=True)
    status = "all good" if report.exit_code == 0 else f"{len(report.errors)} error(s)"
    click.echo(f"   validate --deep {os.path.basename(path)} (+ its set): {status}")
    if report.exit_code:
        raise SystemExit(report.exit_code)
