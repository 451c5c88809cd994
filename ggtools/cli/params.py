"""Option types every command shares: text that must be Unicode, numbers that must be finite, counts that fit a C int.

Python decodes a command line's bytes with surrogateescape, so bytes that are not UTF-8 reach a command as lone
surrogates, which any later encode (tokenizing a prompt, writing a GGUF string) fails on. A path may hold any
bytes (the OS takes them back unchanged); every other text value is checked when it is parsed
(`require_unicode_text`, applied to each command as the CLI loads it).

A float option compared against a measurement (a gate) must be finite: every comparison with NaN is false, so a
gate of NaN could never fail (`FiniteFloatRange`).

A count the decoding options give (tokens, slots, drafts, nodes, ranks, threads) is a C int in llama.cpp and
lucebox, as token positions are: at most 2^31 - 1 (`Count`). A larger one (400 digits, say) is refused as it is
parsed, shown shortened, before any bound computed from it (bytes of memory, nodes of a tree) could overflow.
"""

import math

import click


class UnicodeText(click.types.StringParamType):
    """A text value whose bytes are UTF-8."""

    name = "text"

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        problem = unicode_problem(value)
        if problem:
            self.fail(problem, param, ctx)
        return value


UNICODE_TEXT = UnicodeText()


def unicode_problem(text: str) -> str | None:
    """Why text is not Unicode text (None if it is): the first undecodable byte or lone surrogate."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            if "\udc80" <= ch <= "\udcff":         # a byte surrogateescape could not decode
                return f"not UTF-8 text: byte 0x{ord(ch) - 0xdc00:02x} at character {i}"
            return f"not Unicode text: a lone surrogate U+{ord(ch):04X} at character {i}"
    return None


def require_unicode_text(command: click.Command) -> click.Command:
    """Make every plain text option and argument of command (and of its subcommands) a UnicodeText."""
    for param in command.params:
        if type(param.type) is click.types.StringParamType:
            param.type = UNICODE_TEXT
    for sub in getattr(command, "commands", {}).values():
        require_unicode_text(sub)
    return command


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses NaN and infinities."""

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if not math.isfinite(value):
            self.fail(f"{value} is not a finite number", param, ctx)
        return value


INT32_MAX = 2 ** 31 - 1
SHOWN_DIGITS = 20       # a longer number is shown shortened in a message


class Count(click.IntRange):
    """click.IntRange from `min` to at most INT32_MAX (a C int), however many digits the value has."""

    def __init__(self, min: int = 0, max: int = INT32_MAX):
        super().__init__(min=min, max=max)

    def convert(self, value, param, ctx):
        text = value.strip() if isinstance(value, str) else ""
        digits = text.lstrip("+-")
        if len(digits) > SHOWN_DIGITS and digits.isascii() and digits.isdigit():
            side = f"less than {self.min}" if text.startswith("-") else f"more than {self.max}"
            self.fail(f"{shortened(text)} is {side}", param, ctx)
        return super().convert(value, param, ctx)


def shortened(number: str) -> str:
    """A number of many digits as its first and last few and its length: '99999999…9999 (400 digits)'."""
    digits = number.lstrip("+-")
    if len(digits) <= SHOWN_DIGITS:
        return number
    return f"{number[:len(number) - len(digits) + 8]}…{digits[-4:]} ({len(digits)} digits)"
