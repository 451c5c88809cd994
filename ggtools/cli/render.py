"""Shared output helpers for CLI commands: JSON, sizes, aligned tables."""

import json

import click


def emit_json(data):
    click.echo(json.dumps(data, indent=1, ensure_ascii=False))


def human_bytes(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def table(rows, headers, align=None) -> str:
    """Rows of strings as an aligned text table; align is a string of 'l'/'r' per column."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    align = align or "l" * len(headers)

    def line(cells):
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
