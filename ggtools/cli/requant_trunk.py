import click

from ggtools.cli.plan_view import show_plan, warn_nonfinite
from ggtools.cli.render import emit_json, human_bytes
from ggtools.jobs.requant import check_disk, plan_requant_trunk, requant_trunk


@click.command("requant-trunk")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False), help="Where the output shards go (same names; made if missing).")
@click.option("--from", "src_type", default="q8_0", show_default=True, help="Type of the tensors to requantize.")
@click.option("--to", "dst_type", default="q4_k", show_default=True, help="Their new type.")
@click.option("--copy", "copy_patterns", multiple=True, metavar="REGEX", help="Also byte-copy tensors matching (repeatable).")
@click.option("--fallback", type=click.Choice(["copy", "llama"]), default="copy", show_default=True,
              help="Tensors whose rows --to's block size does not divide (e.g. 128 columns for Q4_K): keep them as "
                   "they are (copy, as requant_trunk.c does) or give them llama-quantize's fallback type (llama: "
                   "Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; byte-identical to llama-quantize).")
@click.option("--keep-mtp", is_flag=True, help="Byte-copy every tensor of the MTP (NextN) block whatever its type "
              "(Q8_0 stays Q8_0); without it they are treated as llama-quantize treats them, like the trunk's.")
@click.option("--shard", "only", multiple=True, type=click.IntRange(1), metavar="K", help="Only shard K (1-based; repeatable).")
@click.option("-j", "--jobs", type=click.IntRange(1), default=None,
              help="Shards in parallel processes (default: one per CPU core; each holds about 200 MB).")
@click.option("--dry-run", is_flag=True, help="Print the plan and the disk check; write nothing.")
@click.option("--resume", is_flag=True, help="Skip shards the manifest shows finished and still intact; redo the rest.")
@click.option("--no-verify", is_flag=True, help="Skip re-reading outputs (copies hashed against the source).")
@click.option("--allow-nonfinite", is_flag=True, help="Write NaN/inf source values and NaN/inf scales (counted and "
              "reported) instead of refusing the tensor.")
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan / result.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def command(path, out_dir, src_type, dst_type, copy_patterns, fallback, keep_mtp, only, jobs, dry_run, resume,
            no_verify, allow_nonfinite, force, as_json, quiet):
    """Requantize only the --from tensors (the Q8_0 trunk) of a model; MXFP4 experts, F32 norms and every
    other tensor are byte-copied and proven unchanged. Split-in = split-out: one output shard per input
    shard, same names, KVs and tensor order. An MTP (NextN) block's tensors are listed apart in the plan.

    \b
    Examples:
      ggtools requant-trunk Kimi-00001-of-00032.gguf -o out/ --dry-run
      ggtools requant-trunk Kimi-00001-of-00032.gguf -o out/ -j 2
      ggtools requant-trunk Kimi-00001-of-00032.gguf -o out/ --resume
      ggtools requant-trunk Kimi-00001-of-00032.gguf -o out/ --shard 7     # one shard, e.g. per cluster job
      ggtools requant-trunk Kimi-00001-of-00032.gguf -o out/ --fallback llama   # attn_k_b, ssm_f_b -> Q5_0
      ggtools requant-trunk Qwen3.6-35B-A3B-00001-of-00003.gguf -o out/ --keep-mtp   # MTP block stays Q8_0
    """
    plan = plan_requant_trunk(path, out_dir, src_type=src_type, dst_type=dst_type, copy_patterns=copy_patterns,
                              only=only, fallback=fallback, keep_mtp=keep_mtp)
    if dry_run:
        show_plan(plan, as_json=as_json, tensors=not quiet)
        if not as_json:
            check_disk(plan)
            click.echo("disk check: the output fits")
        return
    report = requant_trunk(plan, jobs=jobs, resume=resume, force=force, verify=not no_verify,
                           allow_nonfinite=allow_nonfinite, progress=False if quiet or as_json else None)
    if as_json:
        emit_json({"done": report.done, "skipped": report.skipped, "manifest": report.manifest,
                   "bytes_in": plan.bytes_in, "bytes_out": plan.bytes_out, "verified": not no_verify,
                   "nonfinite": report.nonfinite})
        return
    warn_nonfinite(report)
    for p in report.skipped:
        click.echo(f"skipped (finished and intact): {p}")
    click.echo(f"{len(report.done)} shard(s) written{', verified' if not no_verify else ''}: "
               f"{human_bytes(plan.bytes_in)} -> {human_bytes(plan.bytes_out)}; manifest {report.manifest}")
