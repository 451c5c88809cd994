"""Pre-tokenizer regexes with Unicode property classes (\\p{L}, \\p{N}, ...) for Python's own `re`.

`re` has no \\p{..}; each one is expanded into an explicit character class built from `unicodedata`
categories, and \\s / \\S into Unicode White_Space (what llama.cpp and the `regex` package mean by \\s;
`re`'s \\s would also match U+001C..U+001F).
"""

import itertools
import re
import sys
import unicodedata
from functools import lru_cache

WHITE_SPACE = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"


def category_class(name: str) -> str:
    """Class body (no brackets) of every code point in general category `name` ('L', 'N', or 'Lu'...)."""
    try:
        return _all_classes()[name]
    except KeyError:
        raise ValueError(f"unknown Unicode category \\p{{{name}}}") from None


@lru_cache(maxsize=None)
def _all_classes() -> dict[str, str]:
    """One pass over the code points: ranges per full (Lu) and major (L) category."""
    cats = map(unicodedata.category, map(chr, range(sys.maxunicode + 1)))
    ranges: dict[str, list] = {}
    cp = 0
    for cat, run in itertools.groupby(cats):
        n = sum(1 for _ in run)
        for key in (cat, cat[0]):
            spans = ranges.setdefault(key, [])
            if spans and spans[-1][1] == cp - 1:
                spans[-1][1] = cp + n - 1
            else:
                spans.append([cp, cp + n - 1])
        cp += n
    return {key: "".join(_char(a) if a == b else f"{_char(a)}-{_char(b)}" for a, b in spans)
            for key, spans in ranges.items()}


def _char(cp: int) -> str:
    return f"\\U{cp:08x}" if cp > 0xFFFF else f"\\u{cp:04x}"


def expand(pattern: str) -> str:
    """The pattern with \\p{X}, \\s and \\S rewritten for `re`."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            m = re.match(r"\\p\{(\w+)\}", pattern[i:])
            if m:
                body = category_class(m.group(1))
                out.append(body if in_class else f"[{body}]")
                i += m.end()
                continue
            esc = pattern[i:i + 2]
            if esc == "\\s":
                out.append(WHITE_SPACE if in_class else f"[{WHITE_SPACE}]")
            elif esc == "\\S":
                if in_class:
                    raise ValueError(f"\\S inside a character class is not supported: {pattern!r}")
                out.append(f"[^{WHITE_SPACE}]")
            else:
                out.append(esc)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def compile_pattern(pattern: str) -> re.Pattern:
    return re.compile(expand(pattern))
