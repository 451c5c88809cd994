"""The one base class every layer's error derives from, so the CLI can report any of them in one line.

Each package raises its own class: GGUFError (gguf), QuantError (quants), DFlashError (dflash), EngineError
(engine), JobError (jobs, with UsageError for options that cannot work), ModelError (runtime).
"""


class GGToolsError(Exception):
    """An error meant for a person: the message names the file, the place and the rule."""

    exit_code = 2


def located(path, rule: str, place: str | None = None) -> str:
    """`path: place: rule` (or `path: rule`), the one-line form of an error about a file."""
    return f"{path}: {place}: {rule}" if place else f"{path}: {rule}"
