import click

from ggtools.cli.render import emit_json, human_bytes, table
from ggtools.jobs.inspect import inspect

VALUE_WIDTH = 100


@click.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--tensors", metavar="REGEX", help="Only tensors whose name matches (re.search).")
@click.option("--kv", metavar="REGEX", help="Only keys that match (re.search).")
@click.option("--full-arrays", is_flag=True, help="Print whole arrays (vocabularies!) instead of the first items.")
def command(path, as_json, tensors, kv, full_arrays):
    """Show metadata, tensors and per-type totals of a GGUF file or a whole shard set.

    \b
    Examples:
      ggtools inspect model.gguf
      ggtools inspect model-00001-of-00032.gguf --tensors '_exps' --kv '^split\\.'
      ggtools inspect drafter.gguf --json | jq '.kv[] | select(.key | test("mask"))'
    """
    info = inspect(path, tensors=tensors, kv=kv, full_arrays=full_arrays)
    if as_json:
        emit_json(info)
        return
    for f in info["files"]:
        click.echo(f"{f['path']}: GGUF v{f['version']}, {human_bytes(f['size'])}, {f['kv_count']} KVs, "
                   f"{f['tensor_count']} tensors, alignment {f['alignment']}, data at byte {f['data_offset']}")
    if info["drafter"]:
        click.echo(f"drafter ({info['drafter']['layout']} layout): {info['drafter']['summary']}")
    if info["mtp"]:
        m = info["mtp"]
        click.echo(f"{'MTP sidecar' if m['sidecar'] else 'MTP block'}: nextn_predict_layers "
                   f"{m['nextn_predict_layers']}, block(s) {', '.join(map(str, m['blocks']))} of block_count "
                   f"{m['block_count']} ({m['trunk_blocks']} trunk); {len(m['tensors'])} tensors")
    click.echo()
    click.echo(table([(k["key"], k["type"], _show_value(k)) for k in info["kv"]], ["key", "type", "value"]))
    click.echo()
    multi = len(info["files"]) > 1
    rows = [(t["name"], t["type"], "x".join(map(str, t["ne"])), human_bytes(t["bytes"]))
            + ((t["shard"] + 1,) if multi else ()) for t in info["tensors"]]
    click.echo(table(rows, ["tensor", "type", "ne", "bytes"] + (["shard"] if multi else []),
                     "lllr" + ("r" if multi else "")))
    click.echo()
    totals = info["totals"]
    rows = [(name, e["tensors"], human_bytes(e["bytes"])) for name, e in totals["by_type"].items()]
    rows.append(("total", totals["tensors"], human_bytes(totals["bytes"])))
    click.echo(table(rows, ["type", "tensors", "bytes"], "lrr"))


def _show_value(k) -> str:
    v = k["value"]
    if "count" in k:
        shown = ", ".join(repr(x) for x in v)
        text = f"[{k['count']}] {shown}" + (", ..." if len(v) < k["count"] else "")
    else:
        text = repr(v) if isinstance(v, str) else str(v)
    text = text.replace("\n", "\\n")
    return text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 3] + "..."
