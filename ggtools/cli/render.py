"""Shared output helpers for CLI commands: JSON, sizes, aligned tables."""

import json

import click

from ggtools.byte_sizes import human_bytes  # noqa: F401  (re-exported for the commands)


def emit_json(data):
    click.echo(json.dumps(data, indent=1, ensure_ascii=False))


def table(rows, headers, align=None) -> str:
    """Rows of strings as an aligned text table; align is a string of 'l'/'r' per column."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    align = align or "l" * len(headers)

    def line(cells):
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
