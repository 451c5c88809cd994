"""Inputs: a path given to read must name an existing regular file (or a directory where one is expected).

Checked with stat before anything opens the path: opening a FIFO blocks until a writer comes, a device
reads forever, and a dangling symbolic link would otherwise be reported as something else than missing.
"""

import json
import os
import stat

from ggtools.gguf.errors import GGUFError

KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def regular_file(path) -> os.stat_result:
    """The stat of path, which must be (or link to) an existing regular file."""
    st = _stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise GGUFError(path, f"is {kind(st)}, not a regular file")
    return st


def directory(path) -> os.stat_result:
    st = _stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise GGUFError(path, f"is {kind(st)}, not a directory")
    return st


def kind(st: os.stat_result) -> str:
    for test, name in KINDS:
        if test(st.st_mode):
            return name
    return "a regular file" if stat.S_ISREG(st.st_mode) else "a special file"


def _stat(path) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise GGUFError(path, f"not found (a dangling symbolic link to {os.readlink(path)})") from None
        raise GGUFError(path, "not found") from None
    except NotADirectoryError:
        raise GGUFError(path, "not found (a component of the path is not a directory)") from None
    except OSError as e:
        raise GGUFError(path, f"cannot read: {e.strerror or e}") from None


MAX_TEXT = 256 << 20       # a manifest of a 10,000-shard set is a few MB


def read_text(path, limit=MAX_TEXT) -> str:
    """A small text input (a manifest), as UTF-8 text."""
    st = regular_file(path)
    if st.st_size > limit:
        raise GGUFError(path, f"{st.st_size} bytes is too large for a manifest (at most {limit})")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as e:
        raise GGUFError(path, f"cannot read: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GGUFError(path, f"not text: byte {e.start} is not UTF-8") from None


def parse_json(path, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise GGUFError(path, f"not JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise GGUFError(path, "not a manifest: the JSON is nested too deeply") from None
