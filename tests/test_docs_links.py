"""Every relative link in the repository's Markdown leads to a file, and every ``#anchor``
to a heading of the page it names.

A page is renamed or a heading reworded, and the links to it go dead without anyone
noticing: this reads each Markdown file (README.md, docs/, bench/, the example policies'
READMEs, ...) and resolves its links the way GitHub renders them. Links to other sites
are not followed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".git", ".venv", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache"}

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_HTML_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


def markdown_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        found += [Path(folder, name) for name in files if name.endswith(".md")]
    return sorted(found)


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their 1-based numbers."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces
    to hyphens (``_`` and ``-`` kept)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    found = set(_HTML_ID.findall(text))
    for _, line in _prose_lines(text):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            where = f"{path.relative_to(root)}:{number}: {target}"
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


def test_the_markdown_pages_are_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in markdown_files()}
    assert {"README.md", "bench/README.md", "docs/service.md"} <= names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_a_dead_link_and_a_dead_anchor_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n### Flags\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Title with `code`, and commas\n\n## Same\n\n## Same\n\n"
        "[ok](#title-with-code-and-commas) [ok](#same-1) [ok](other.md#flags)\n"
        "[gone](missing.md) [no heading](other.md#no-such-heading) [gone](#same-2)\n"
        "[site](https://example.org/x.md) `[in code](missing-too.md)`\n\n"
        "```\n[fenced](missing-fenced.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page, tmp_path)
    assert len(problems) == 3, problems
    assert problems[0] == "docs/page.md:8: missing.md: no such file"
    assert problems[1].endswith("no heading #no-such-heading in docs/other.md")
    assert "#same-2" in problems[2]
