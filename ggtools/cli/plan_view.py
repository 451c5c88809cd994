"""Printing a Plan (--dry-run) and a run's outcome, shared by the rewriting commands."""

import os

import click

from ggtools.cli.render import emit_json, human_bytes, table


def show_plan(plan, *, as_json=False, tensors=True):
    if as_json:
        emit_json(plan.as_dict())
        return
    if tensors:
        for s in plan.shards:
            click.echo(f"{s.src} -> {s.dst}")
            if s.kv_edits:
                click.echo(f"  metadata: set {sorted(s.kv_edits.changes) or '-'}; "
                           f"remove {sorted(s.kv_edits.removed) or '-'}")
            for part in dict.fromkeys(a.part for a in s.tensors):      # the model's own tensors first
                if part:
                    click.echo(f"  {part}:")
                rows = [_tensor_row(a) for a in s.tensors if a.part == part]
                click.echo(_indent(table(rows, ["tensor", "action", "type", "in", "out", "reason"], "lllrrl")))
            click.echo()
    if len(plan.shards) > 1 or not tensors:
        rows = [(os.path.basename(s.dst), sum(a.action == "convert" for a in s.tensors),
                 sum(a.action == "copy" for a in s.tensors), human_bytes(s.bytes_in), human_bytes(s.bytes_out))
                for s in plan.shards]
        click.echo(table(rows, ["shard", "convert", "copy", "in", "out"], "lrrrr"))
        click.echo()
    rows = [(action, f"{a} -> {b}" if action == "convert" else a, n, human_bytes(i), human_bytes(o))
            for (action, a, b), (n, i, o) in sorted(plan.summary().items())]
    rows.append(("total", "", sum(len(s.tensors) for s in plan.shards), human_bytes(plan.bytes_in),
                 human_bytes(plan.bytes_out)))
    click.echo(table(rows, ["action", "types", "tensors", "in", "out"], "llrrr"))
    for part, actions in _parts(plan).items():
        n_conv = sum(a.action == "convert" for a in actions)
        size_in, size_out = (human_bytes(sum(getattr(a, b) for a in actions)) for b in ("bytes_in", "bytes_out"))
        click.echo(f"{part}: {len(actions)} tensors, {n_conv} converted, {len(actions) - n_conv} copied; "
                   f"{size_in} -> {size_out}")


def _tensor_row(a):
    return (a.name, a.action, f"{_t(a.src_type)} -> {_t(a.dst_type)}" if a.action == "convert" else _t(a.src_type),
            human_bytes(a.bytes_in), human_bytes(a.bytes_out), a.reason)


def _parts(plan) -> dict:
    """part -> its tensors' actions, for the parts a plan lists apart (an MTP block)."""
    out = {}
    for s in plan.shards:
        for a in s.tensors:
            if a.part:
                out.setdefault(a.part, []).append(a)
    return out


def warn_nonfinite(report):
    """One warning per output tensor written with NaN/inf values (--allow-nonfinite)."""
    for path, tensors in report.nonfinite.items():
        for name, n in tensors.items():
            click.echo(f"warning: {path}: tensor '{name}': {n} NaN/inf values or blocks written (--allow-nonfinite)",
                       err=True)


def _t(type_id):
    from ggtools.gguf import ggml_type_name
    return ggml_type_name(type_id)


def _indent(text):
    return "\n".join("  " + line for line in text.splitlines())
