import sys

import click
from tqdm import tqdm

from ggtools.cli.plan_view import show_plan
from ggtools.cli.render import emit_json, human_bytes
from ggtools.jobs.convert import OUTTYPES, PROFILES, convert_dflash, write


@click.group("convert")
def command():
    """Convert checkpoints to GGUF."""


@command.command("dflash")
@click.argument("hf_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="Output GGUF.")
@click.option("--profile", type=click.Choice(PROFILES), default="llama.cpp", show_default=True,
              help="Whose loader the file is for: llama.cpp (arch dflash) or lucebox (arch qwen35-dflash-draft).")
@click.option("--target-gguf", "target", type=click.Path(exists=True, dir_okay=False),
              help="The target model's GGUF (any shard): its tokenizer is embedded (llama.cpp profile), the mask id, "
                   "layer ids and hidden size are checked against it. Required for the llama.cpp profile.")
@click.option("--outtype", type=click.Choice(OUTTYPES), default="auto", show_default=True,
              help="llama.cpp profile: type of the weights (auto: as llama.cpp's converter guesses, BF16 kept). "
                   "Norms and 1-D tensors are always F32.")
@click.option("--mask-token-id", type=click.IntRange(0, 2 ** 32 - 1),
              help="Mask token id (default: dflash_config.mask_token_id, else the top-level mask_token_id).")
@click.option("--guess-target-layers", is_flag=True,
              help="Accept z-lab's build_target_layer_ids guess when config.json has no target_layer_ids "
                   "(often wrong: z-lab/dflash#156).")
@click.option("--allow-overflow", is_flag=True, help="Write values beyond ±65504 as inf when storing F16 "
                                                     "(otherwise an error naming each tensor).")
@click.option("--name", help="general.name (llama.cpp profile; default: from the model card or directory name).")
@click.option("--dry-run", is_flag=True, help="Check everything and print the plan; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan / result.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def dflash(hf_dir, out, profile, target, outtype, mask_token_id, guess_target_layers, allow_overflow, name,
           dry_run, force, as_json, quiet):
    """Convert a Hugging Face DFlash v1 (DFlashDraftModel), DFlash2 (DFlash2DraftModel) or DSpark drafter
    (Qwen3DSparkModel, DSparkDraftModel, DSparkSpeculator, Lfm2DSparkDraftModel, LingDSparkModel) to GGUF.

    The llama.cpp profile writes what llama.cpp's own converter writes (arch dflash, target layer ids + 1,
    tokenizer.ggml.mask_token_id, the target's tokenizer; DSpark: markov_w1/w2, conf_proj, d2t as I64 ids).
    The lucebox profile writes what lucebox's converter writes (arch qwen35-dflash-draft, dflash.fc /
    dflash.hidden_norm, raw ids, BF16 stored as F16; DSpark: dflash.dspark.*); DFlash v1 and bonus-anchor
    DSpark over the full vocabulary only. DSpark configs in DeepSpec's flat layout or the speculators layout.
    Single or sharded safetensors, names with or without 'model.'. Memory stays at about one row chunk.

    \b
    Examples:
      ggtools convert dflash Qwen3-8B-DFlash-b16/ -o dflash.gguf --target-gguf Qwen3-8B-Q8_0.gguf
      ggtools convert dflash Qwen3-8B-DFlash-b16/ -o dflash-q8.gguf --target-gguf Qwen3-8B-Q8_0.gguf --outtype q8_0
      ggtools convert dflash Qwen3.5-27B-DFlash/ -o draft.gguf --profile lucebox --target-gguf Qwen3.5-27B.gguf
      ggtools convert dflash old-drafter/ -o d.gguf --target-gguf t.gguf --mask-token-id 151669 --dry-run
      ggtools convert dflash dspark_qwen3_8b_block7/ -o dspark.gguf --target-gguf Qwen3-8B-Q8_0.gguf
    """
    plan = convert_dflash(hf_dir, out, profile=profile, target=target, outtype=outtype, mask_token_id=mask_token_id,
                          guess_target_layers=guess_target_layers, name=name, dry_run=True)
    if dry_run:
        _show(plan, as_json, quiet)
        return
    _write(plan, force, allow_overflow, as_json, quiet, f"{profile} profile")


def _write(plan, force, allow_overflow, as_json, quiet, written_as, extra_json=None):
    """Write the plan with a progress bar; report the result (written_as: the profile or layout, in words)."""
    show_progress = not (quiet or as_json) and sys.stderr.isatty()
    with tqdm(total=plan.bytes_out, unit="B", unit_scale=True, desc="convert", disable=not show_progress) as bar:
        result = write(plan, force=force, allow_overflow=allow_overflow, on_bytes=bar.update)
    if as_json:
        emit_json({"written": result.path, "found": result.found, "tensors": result.n_tensors,
                   "bytes": result.bytes_out, "overflow": result.overflow, "nonfinite": result.nonfinite,
                   "warnings": result.warnings} | (extra_json or {}))
        return
    _warn(result.warnings)
    click.echo(f"wrote {result.path}: {result.found}; {result.n_tensors} tensors, {human_bytes(result.bytes_out)} "
               f"({written_as})")


def _show(plan, as_json, quiet):
    if as_json:
        emit_json(plan.as_dict())
        return
    cfg = plan.cfg
    click.echo(f"{plan.hf_dir}: {plan.found}; profile {plan.profile}, outtype {plan.outtype}")
    click.echo(f"  target layer ids {cfg.target_layer_ids} ({cfg.ids_from}); mask token id {cfg.mask_token_id} "
               f"({cfg.mask_from}); block size {cfg.block_size} ({cfg.block_size_from})")
    click.echo(f"  {len(plan.kvs.keys())} metadata keys")
    show_plan(plan.as_plan(), tensors=not quiet)
    _warn(plan.warnings)


def _warn(warnings):
    for w in warnings:
        click.echo(f"warning: {w}", err=True)


@command.command("drafter")
@click.argument("hf_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="Output GGUF.")
@click.option("--target-gguf", "target", type=click.Path(exists=True, dir_okay=False),
              help="The target model's GGUF (any shard): its tokenizer is embedded; its layer count, hidden size and "
                   "vocabulary are what the drafter is checked against (EAGLE3: what target_layers and "
                   "target_hidden_size default to). Required for the llama.cpp layout.")
@click.option("--target-model-dir", type=click.Path(exists=True, file_okay=False),
              help="EAGLE3: the target's Hugging Face directory, as llama.cpp's converter takes it: its config.json "
                   "gives the layer count, hidden size and vocab_size (and must describe the --target-gguf model; "
                   "the tokenizer still comes from --target-gguf).")
@click.option("--profile", type=click.Choice(PROFILES), default="llama.cpp", show_default=True,
              help="DFlash / DSpark: whose loader the file is for (EAGLE3: llama.cpp only).")
@click.option("--outtype", type=click.Choice(OUTTYPES), default="auto", show_default=True,
              help="Type of the weights (auto: as llama.cpp's converter guesses, BF16 kept). Norms and 1-D tensors "
                   "are always F32; d2t I64.")
@click.option("--mask-token-id", type=click.IntRange(0, 2 ** 32 - 1), help="DFlash / DSpark: the mask token id.")
@click.option("--guess-target-layers", is_flag=True, help="DFlash: accept z-lab's target layer id guess.")
@click.option("--allow-overflow", is_flag=True, help="Write values beyond ±65504 as inf when storing F16.")
@click.option("--name", help="general.name (default: from the model card or directory name).")
@click.option("--dry-run", is_flag=True, help="Check everything and print the plan; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan / result.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def drafter(hf_dir, out, target, target_model_dir, profile, outtype, mask_token_id, guess_target_layers,
            allow_overflow, name, dry_run, force, as_json, quiet):
    """Convert any drafter checkpoint llama.cpp's converter takes, the family detected from config.json and named
    in one line: DFlash v1, DFlash2, DSpark (as `convert dflash`) or EAGLE3 (LlamaForCausalLMEagle3,
    Eagle3LlamaForCausalLM, Eagle3Speculator, Eagle3DraftModel; EAGLE 3.1 with norm_before_fc). EAGLE3 is written
    as llama.cpp's converter writes it (arch eagle3, d2t as absolute I64 ids, t2d dropped, q/k permuted for its
    RoPE, rope_freqs for llama3 scaling), byte for byte; the target's layers, hidden size and tokenizer come from
    --target-gguf. llama.cpp never detects EAGLE3 from the file: run it with --spec-type draft-eagle3.

    \b
    Examples:
      ggtools convert drafter EAGLE3-LLaMA3.1-Instruct-8B/ -o eagle3.gguf --target-gguf Llama-3.1-8B-Q8_0.gguf
      ggtools convert drafter Qwen3-8B-speculator.eagle3/ -o e3.gguf --target-gguf Qwen3-8B.gguf --outtype q8_0
      ggtools convert drafter Qwen3-8B-DFlash-b16/ -o dflash.gguf --target-gguf Qwen3-8B-Q8_0.gguf --dry-run
    """
    from ggtools.jobs.convert_drafter import EAGLE3, convert_drafter
    plan = convert_drafter(hf_dir, out, target=target, target_model_dir=target_model_dir, profile=profile,
                           outtype=outtype, mask_token_id=mask_token_id, guess_target_layers=guess_target_layers,
                           name=name, dry_run=True)
    eagle3 = getattr(plan, "family", None) == EAGLE3
    if dry_run:
        if as_json or not eagle3:
            _show(plan, as_json, quiet)
        else:
            click.echo(f"{plan.hf_dir}: {plan.found}; outtype {plan.outtype}")
            click.echo(f"  {len(plan.kvs.keys())} metadata keys")
            show_plan(plan.as_plan(), tensors=not quiet)
            _warn(plan.warnings)
        return
    _write(plan, force, allow_overflow, as_json, quiet, f"{plan.profile} layout",
           {"spec_type": "draft-eagle3"} if eagle3 else None)
    if eagle3 and not as_json:
        from ggtools.dflash.eagle3 import SPEC_HINT
        click.echo(f"note: {SPEC_HINT}", err=True)


@command.command("gguf-layout")
@click.argument("draft", type=click.Path(exists=True, dir_okay=False))
@click.option("--to", "to", required=True, type=click.Choice(PROFILES), help="The layout to move the drafter to.")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="Output GGUF.")
@click.option("--target", type=click.Path(exists=True, dir_okay=False),
              help="The target GGUF: its tokenizer, which the llama.cpp layout carries (needed when the drafter has "
                   "none).")
@click.option("--dry-run", is_flag=True, help="Print the plan (each tensor copied or converted, and why); write "
                                              "nothing.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan.")
def gguf_layout(draft, to, out, target, dry_run, force, as_json):
    """Move a DFlash drafter GGUF to another runtime's layout: arch, key names, tensor names, where the mask id
    lives and the target-layer id convention (llama.cpp: HF id + 1; lucebox: HF id). Tensors are byte-copied where
    the destination's runtime takes their encoding and converted otherwise; the plan says which, and why.
    Values are moved as they are: to check and repair them, use `ggtools doctor` (`--fix --to` does both).

    \b
    Examples:
      ggtools convert gguf-layout draft-lucebox.gguf --to llama.cpp --target Qwen3.5-27B.gguf -o draft.gguf
      ggtools convert gguf-layout dflash.gguf --to lucebox -o draft-lucebox.gguf --dry-run
    """
    from ggtools.jobs.doctor import move_layout
    plan, notes = move_layout(draft, out, to, target=target, force=force, dry_run=dry_run)
    if as_json:
        emit_json(plan.as_dict() | {"notes": notes, "written": None if dry_run else out})
        return
    if dry_run:
        show_plan(plan)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    if not dry_run:
        actions = plan.shards[0].tensors
        converted = sorted({a.reason for a in actions if a.action == "convert"})
        n_conv = sum(a.action == "convert" for a in actions)
        click.echo(f"wrote {out} ({to} layout): {len(actions) - n_conv} tensors byte-copied, {n_conv} converted"
                   + (f" ({'; '.join(converted)})" if converted else ""))


@command.command("mtp")
@click.argument("target", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="Output GGUF. With --strip and a shard set, named as llama.cpp's converter names a split "
                   "--outfile: OUT.gguf gives OUT-00001-of-0000N.gguf, ...")
@click.option("--strip", is_flag=True, help="Write the target without its MTP block (llama.cpp's --no-mtp) instead "
                                            "of the sidecar.")
@click.option("--dry-run", is_flag=True, help="Check everything and print the plan; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite existing outputs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan / result.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar; the plan without its tensor rows.")
def mtp(target, out, strip, dry_run, force, as_json, quiet):
    """Write a Qwen3.5 / Qwen3.6 / Qwen3-Next target's MTP (NextN) block as its own GGUF, the MTP sidecar, byte for
    byte what llama.cpp's converter writes with --mtp from the same checkpoint (the target's keys, token_embd,
    output_norm, output and the MTP block); or, with --strip, the target without it, as --no-mtp writes it
    (block_count over the trunk, no nextn_predict_layers). TARGET: a GGUF or any shard of a set (the sidecar is one
    file; --strip keeps the set's shard boundaries). Tensors are byte-copied and verified; the input is never
    modified. See docs/mtp.md.

    \b
    Examples:
      ggtools convert mtp Qwen3.6-35B-A3B-Q8_0.gguf -o mtp-Qwen3.6-35B-A3B-Q8_0.gguf
      ggtools convert mtp Qwen3.6-35B-A3B-Q8_0-00001-of-00003.gguf -o mtp-Qwen3.6-35B-A3B-Q8_0.gguf --dry-run
      ggtools convert mtp --strip Qwen3.6-35B-A3B-Q8_0.gguf -o Qwen3.6-35B-A3B-Q8_0-no-mtp.gguf
    """
    from ggtools.jobs.mtp import plan_sidecar, plan_strip, write as write_mtp
    planned = (plan_strip if strip else plan_sidecar)(target, out)
    blocks = planned.blocks
    found = f"{blocks.arch}: {blocks.n_layer} trunk blocks, MTP block(s) {', '.join(map(str, blocks.ids))}"
    if dry_run:
        if as_json:
            emit_json(planned.as_dict())
            return
        click.echo(f"{target}: {found}; {len(planned.left_out)} tensors left out")
        show_plan(planned.plan, tensors=not quiet)
        return
    report = write_mtp(planned, force=force, progress=False if quiet or as_json else None)
    if as_json:
        emit_json({"written": report.done, "found": found, "left_out": planned.left_out,
                   "tensors": sum(len(s.tensors) for s in planned.plan.shards), "bytes": planned.plan.bytes_out})
        return
    what = "without its MTP block" if strip else "MTP sidecar"
    click.echo(f"wrote {', '.join(report.done)} ({what}; {found}): "
               f"{sum(len(s.tensors) for s in planned.plan.shards)} tensors byte-copied and verified, "
               f"{human_bytes(planned.plan.bytes_out)}; {len(planned.left_out)} left out")
