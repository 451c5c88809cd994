"""Every relative link in the README and docs/ resolves: the file exists and a #anchor names one of its headings
(GitHub's heading ids). docs/README.md maps every page; docs/benchmarks.md has a section for every bench that
writes one."""

import re
from pathlib import Path

from scripts.bench.page import markers

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^()\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def pages() -> list:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def prose(text: str) -> str:
    """The text without fenced blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def heading_ids(text: str) -> set:
    """GitHub's ids of the page's headings: lower case, punctuation dropped, spaces to hyphens, -1, -2 for repeats."""
    ids, seen = set(), {}
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def broken_links(page: Path) -> list:
    """'page: link (why)' for each relative link of the page that does not resolve."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in heading_ids(dest.read_text()):
            broken.append(f"{page.name}: {target} (no heading #{anchor} in {dest.name})")
    return broken


def test_every_link_in_the_docs_resolves():
    assert [b for page in pages() for b in broken_links(page)] == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Its `second` part (x, y)\n\ntext\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md) [ok](a.md#a-page) [ok](a.md#its-second-part-x-y) [ok](#b) [web](https://example.com/x)\n"
        "`[not a link](gone.md)`\n```\n[not a link](gone.md)\n```\n"
        "# B\n[file](gone.md) [anchor](a.md#no-such-part) [here](#nowhere)\n")
    assert broken_links(tmp_path / "b.md") == [
        "b.md: gone.md (no such file)",
        "b.md: a.md#no-such-part (no heading #no-such-part in a.md)",
        "b.md: #nowhere (no heading #nowhere in b.md)"]


def test_repeated_headings_get_numbered_ids():
    assert heading_ids("# Tests\n## Tests\n### Limits: what is not done\n") == {
        "tests", "tests-1", "limits-what-is-not-done"}


def test_the_docs_map_lists_every_page():
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", (ROOT / "docs" / "README.md").read_text()))
    assert {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"} - listed == set()


def test_every_bench_with_a_section_has_its_markers():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    benches = [p.stem for p in (ROOT / "scripts" / "bench").glob("*.py") if "page.add_option(" in p.read_text()]
    assert len(benches) >= 8
    for name in benches:
        begin, end = markers(name)
        assert page.count(begin) == 1 and page.count(end) == 1 and page.index(begin) < page.index(end), name
