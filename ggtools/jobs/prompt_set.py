"""Prompt sets for `ggtools accept`: a JSONL file, a plain text file, or the built-in default set.

JSONL (a `.jsonl` or `.json` file): one object per line, `{"prompt": "text"}` or `{"prompt_ids": [ids]}`, optional
`"id"` (string or integer; default: the prompt's number in the set), other keys ignored; blank lines skipped.
Any other file is plain text: one prompt per paragraph, paragraphs separated by blank lines.
Lines end at "\n" (or "\r\n") only: U+2028, U+0085 and the other characters str.splitlines() breaks at are
text (JSON allows them raw inside strings). Strings must be Unicode (a JSON escape can write a lone surrogate).
Texts are tokenized with the target's vocabulary (as `ggtools run --prompt` does); ids must lie in it. With a
`room` (the tokens left after -n), a prompt longer than that is refused, a text that cannot fit before it is
tokenized.
"""

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ggtools.byte_sizes import human_bytes
from ggtools.gguf.inputs import regular_file
from ggtools.jobs.errors import JobError
from ggtools.jobs.limits import longest_token_bytes, too_long_to_fit

JSONL_SUFFIXES = (".jsonl", ".json")
MAX_FILE = 256 << 20            # bytes of a prompts file


class PromptSetError(JobError):
    pass


@dataclass
class Prompt:
    id: str
    ids: list[int]               # token ids
    text: str | None = None      # the text it was tokenized from, if any


@dataclass
class _Entry:                    # one prompt as read, before tokenizing
    id: str
    where: str                   # "FILE:LINE", for messages
    text: str | None = None
    ids: list | None = None


def default_prompts_path() -> Path:
    return Path(str(resources.files("ggtools") / "data" / "accept" / "prompts.jsonl"))


def load_prompts(path, tokenizer, n_vocab: int, room: tuple[int, str] | None = None) -> list[Prompt]:
    """The prompts of `path` (None: the default set) as token ids. tokenizer: the target's (None if it has no
    vocabulary: then only prompt_ids work); room: (the most tokens a prompt may have, why)."""
    path = Path(path) if path is not None else default_prompts_path()
    entries = _read_jsonl(path) if path.suffix.lower() in JSONL_SUFFIXES else _read_paragraphs(path)
    if not entries:
        raise PromptSetError(f"{path}: no prompts (the file is empty)")
    seen = {}
    for e in entries:
        if e.id in seen:
            raise PromptSetError(f"{e.where}: id {e.id!r} repeats the prompt at {seen[e.id]}")
        seen[e.id] = e.where
    per_token = longest_token_bytes(tokenizer) if tokenizer is not None and room else None
    prompts = []
    for e in entries:
        if e.text is not None and per_token:
            fewest = too_long_to_fit(e.text, room[0], per_token)
            if fewest:
                raise PromptSetError(f"{e.where}: the prompt ({len(e.text.encode('utf-8'))} bytes) takes at least "
                                     f"{fewest} tokens, more than the {room[0]} that fit ({room[1]})")
        prompts.append(_tokenized(e, tokenizer, n_vocab))
        if room and len(prompts[-1].ids) > room[0]:
            raise PromptSetError(f"{e.where}: the prompt has {len(prompts[-1].ids)} tokens, more than the {room[0]} "
                                 f"that fit ({room[1]})")
    return prompts


def _lines(text: str) -> list[str]:
    """Lines ending at \n (a \r before it dropped), not at every character str.splitlines() breaks at."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _read_text(path: Path) -> str:
    if path.exists():
        st = regular_file(path)          # a FIFO would block the read
        if st.st_size > MAX_FILE:
            raise PromptSetError(f"{path}: {human_bytes(st.st_size)} is too large for a prompts file (at most "
                                 f"{human_bytes(MAX_FILE)})")
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise PromptSetError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise PromptSetError(f"{path}: is a directory, not a prompts file") from None
    except UnicodeDecodeError as e:
        raise PromptSetError(f"{path}: byte {e.start}: not UTF-8 text") from None
    except OSError as e:
        raise PromptSetError(f"{path}: cannot read: {e.strerror}") from None


def _read_paragraphs(path: Path) -> list[_Entry]:
    entries, lines, first = [], [], 0
    for number, line in enumerate(_lines(_read_text(path)) + [""], 1):
        if line.strip():
            first = first or number
            lines.append(line)
        elif lines:
            entries.append(_Entry(str(len(entries) + 1), f"{path}:{first}", text="\n".join(lines)))
            lines, first = [], 0
    return entries


def _read_jsonl(path: Path) -> list[_Entry]:
    entries = []
    for number, line in enumerate(_lines(_read_text(path)), 1):
        if line.strip():
            entries.append(_entry(_json_object(line, f"{path}:{number}"), f"{path}:{number}", len(entries) + 1))
    return entries


def _json_object(line: str, where: str) -> dict:
    try:
        value = json.loads(line)
    except ValueError as e:
        raise PromptSetError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise PromptSetError(f"{where}: JSON nested too deeply (a prompt is one flat object)") from None
    if not isinstance(value, dict):
        raise PromptSetError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _entry(obj: dict, where: str, number: int) -> _Entry:
    if ("prompt" in obj) == ("prompt_ids" in obj):
        raise PromptSetError(f"{where}: give exactly one of \"prompt\" and \"prompt_ids\"")
    pid = obj.get("id", number)
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise PromptSetError(f"{where}: \"id\" must be a string or an integer")
    _check_unicode(str(pid), where, "id")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise PromptSetError(f"{where}: \"prompt\" must be a non-empty string")
        _check_unicode(obj["prompt"], where, "prompt")
        return _Entry(str(pid), where, text=obj["prompt"])
    ids = obj["prompt_ids"]
    if not isinstance(ids, list) or not ids or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise PromptSetError(f"{where}: \"prompt_ids\" must be a non-empty list of integers")
    return _Entry(str(pid), where, ids=ids)


def _check_unicode(text: str, where: str, key: str):
    """A JSON escape (\\ud800) can write a lone surrogate, which is not a character: no text holds it."""
    at = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
    if at is not None:
        raise PromptSetError(f"{where}: \"{key}\" holds a lone surrogate U+{ord(text[at]):04X} at character {at} "
                             "(not Unicode text)")


def _tokenized(e: _Entry, tokenizer, n_vocab: int) -> Prompt:
    if e.ids is None:
        if tokenizer is None:
            raise PromptSetError(f"{e.where}: a text prompt needs the target's vocabulary and the target has "
                                 "none: give \"prompt_ids\"")
        ids = tokenizer.encode(e.text)
        if not ids:
            raise PromptSetError(f"{e.where}: the prompt has no tokens")
        return Prompt(e.id, ids, e.text)
    bad = next((t for t in e.ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise PromptSetError(f"{e.where}: token id {bad} is outside the target's vocabulary (0..{n_vocab - 1})")
    return Prompt(e.id, list(e.ids), None)
