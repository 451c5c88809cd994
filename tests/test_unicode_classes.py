"""\\p{..} and \\s expansion for `re` agrees with the `regex` package (when installed) on every code point."""

import sys

import pytest

from ggtools.runtime.unicode_classes import compile_pattern, expand


def test_expansion_rules():
    assert expand(r"a\d") == r"a\d"
    assert expand(r"\p{N}").startswith("[") and expand(r"[^\p{N}]").startswith("[^")
    with pytest.raises(ValueError):
        expand(r"[\S]")
    with pytest.raises(ValueError):
        expand(r"\p{Xx}")


@pytest.mark.parametrize("pattern", [r"\p{L}", r"\p{N}", r"\p{P}", r"\p{M}", r"\s", r"[^\s\p{L}\p{N}]"])
def test_same_code_points_as_regex(pattern):
    regex = pytest.importorskip("regex")
    ours, theirs = compile_pattern(pattern), regex.compile(pattern)
    import unicodedata
    differ = [cp for cp in range(sys.maxunicode + 1)
              if bool(ours.fullmatch(chr(cp))) != bool(theirs.fullmatch(chr(cp)))]
    # the two Unicode databases may differ in version: only newly assigned code points may disagree
    assert all(unicodedata.category(chr(cp)) == "Cn" for cp in differ), [hex(cp) for cp in differ[:10]]
