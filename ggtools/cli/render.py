"""Shared output helpers for CLI commands: JSON, sizes, aligned tables."""

import json

import click

from ggtools.byte_sizes import human_bytes  # noqa: F401  (re-exported for the commands)


def emit_json(data):
    click.echo(json_text(data, indent=1))


def json_text(data, **options) -> str:
    """JSON as UTF-8 text; with \\u escapes where a string holds what UTF-8 cannot encode (a path's bytes that are
    not UTF-8 reach Python as lone surrogates)."""
    text = json.dumps(data, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, **options)
    return text


def printable(text: str) -> str:
    """text for a terminal: bytes that are not UTF-8 (surrogate-escaped) shown as \\xNN, lone surrogates as
    \\uNNNN."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def table(rows, headers, align=None) -> str:
    """Rows of strings as an aligned text table; align is a string of 'l'/'r' per column."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    align = align or "l" * len(headers)

    def line(cells):
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
