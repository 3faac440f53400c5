"""The documentation's links cannot rot: every relative link and image in README.md and
docs/**/*.md names a file or folder of the repository, and a #fragment names a heading of
the page it points to (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens,
-1, -2, ... on repeats). Links inside code are text, not links, and are not checked. And
docs/ holds only what a page links to: every file below it but the top-level pages and the
guides' importable examples is a link or an image of some page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    return _CODE.sub("", _FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """The #fragments GitHub gives the headings of a Markdown text."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", words.replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def targets(page: Path) -> list[tuple[str, Path, str]]:
    """(the link as written, the file it names, its #fragment) of each relative link."""
    out = []
    for target in _LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        out.append((target, (page.parent / path).resolve() if path else page, fragment))
    return out


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file or heading does not exist, as written."""
    broken = []
    for target, file, fragment in targets(page):
        found = file.exists() and file.is_relative_to(ROOT)
        if found and fragment and file.suffix == ".md":
            found = fragment in anchors(file.read_text())
        if not found:
            broken.append(target)
    return broken


def test_anchors_follow_githubs_rules():
    text = "# Results\n## `make demo` with whitened advantages\n## FrozenLake's ceiling\n"
    text += "```\n# not a heading\n```\n## Results\n## A, B: C (D)\n"
    assert anchors(text) == {
        "results",
        "make-demo-with-whitened-advantages",
        "frozenlakes-ceiling",
        "results-1",
        "a-b-c-d",
    }


def test_links_in_code_are_not_links():
    text = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n![d](d.png)\n"
    assert _LINK.findall(prose(text)) == ["a.md", "d.png"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path):
    assert broken_links(page) == []


def test_docs_hold_only_what_a_page_links_to():
    linked = {file for page in PAGES for _, file, _ in targets(page)}
    docs = ROOT / "docs"
    kept = [
        f
        for f in docs.rglob("*")
        if f.is_file()
        and not (f.parent == docs and f.suffix == ".md")
        and not f.is_relative_to(docs / "examples")
    ]
    assert sorted(str(f.relative_to(docs)) for f in kept if f not in linked) == []
