import click

from ggtools.cli.render import emit_json
from ggtools.jobs.patch import patch_mask_token, patch_remove, patch_set

OUTPUT_OPTIONS = [
    click.option("-o", "--out", type=click.Path(), help="Output file (for a shard set: a directory)."),
    click.option("--in-place", is_flag=True, help="Edit the input itself (temp file + rename; only shard 1 of a set)."),
    click.option("--force", is_flag=True, help="Overwrite an existing output."),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable result."),
]


def output_options(f):
    for option in reversed(OUTPUT_OPTIONS):
        f = option(f)
    return f


@click.group("patch")
def command():
    """Edit metadata of a GGUF file or shard set; tensors are byte-copied, only shard 1 is rewritten.

    \b
    Examples:
      ggtools patch mask-token drafter.gguf --in-place
      ggtools patch mask-token drafter.gguf --id 151669 --target target.gguf -o fixed.gguf
      ggtools patch set model-00001-of-00004.gguf general.name=str:"My model" dflash.target_layers=i32[]:2,6 -o out/
      ggtools patch rm model.gguf general.url general.repo_url --in-place
    """


@command.command("mask-token")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--id", "token_id", type=click.IntRange(0, 2 ** 32 - 1), help="Mask token id (default: from "
              "dflash.mask_token_id or <arch>.dflash.mask_token_id in the file).")
@click.option("--target", type=click.Path(exists=True, dir_okay=False), help="Target GGUF: check the id is in its vocabulary.")
@output_options
def mask_token(path, token_id, target, out, in_place, force, as_json):
    """Set tokenizer.ggml.mask_token_id (u32), the key llama.cpp's DFlash drafter loader reads."""
    _report(patch_mask_token(path, token_id, target, out=out, in_place=in_place, force=force), as_json)


@command.command("set")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.argument("assignments", nargs=-1, required=True, metavar="KEY=TYPE:VALUE...")
@output_options
def set_keys(path, assignments, out, in_place, force, as_json):
    """Add or change keys. TYPE: u8 i8 u16 i16 u32 i32 u64 i64 f32 f64 bool str, or TYPE[] for an array
    (values comma-separated or a JSON list)."""
    _report(patch_set(path, assignments, out=out, in_place=in_place, force=force), as_json)


@command.command("rm")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.argument("keys", nargs=-1, required=True)
@output_options
def remove_keys(path, keys, out, in_place, force, as_json):
    """Remove keys."""
    _report(patch_remove(path, keys, out=out, in_place=in_place, force=force), as_json)


def _report(result, as_json):
    edits = result.edits
    if as_json:
        emit_json({"written": result.written, "set": sorted(edits.changes), "removed": sorted(edits.removed),
                   "nonfinite": result.nonfinite})
        return
    for key, (vtype, value, elem) in edits.changes.items():
        click.echo(f"set {key} = {value!r} ({vtype.name}{f'[{elem.name}]' if elem is not None else ''})")
    for key in sorted(edits.removed):
        click.echo(f"removed {key}")
    for p in result.written:
        click.echo(f"wrote {p}")
    for name, n in result.nonfinite.items():
        click.echo(f"warning: tensor '{name}': {n} NaN/inf values or blocks (copied unchanged)", err=True)
