"""The README is a front door: short, and every link in it leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub and mkdocs' toc make it for plain headings."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def broken_links(markdown: str, base: Path) -> list[str]:
    """Relative links of `markdown` whose file, or heading anchor, does not exist."""
    broken = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = base / path if path else None
        if file is None or not file.exists():
            broken.append(target)
        elif anchor and file.is_file() and anchor not in {
                slug(line.lstrip("#")) for line in file.read_text().splitlines()
                if line.startswith("#")}:
            broken.append(target)
    return broken


def test_readme_is_short():
    assert len(README.read_text().splitlines()) < 200


def test_every_readme_link_resolves():
    assert broken_links(README.read_text(), ROOT) == []


def test_a_missing_file_or_heading_is_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Set-up: two commands\n## Commands\n")
    text = ("[ok](a.md) [ok](a.md#set-up-two-commands) [ok](a.md#commands) [web](https://x.y) "
            "[gone](b.md) [bad anchor](a.md#setup)")
    assert broken_links(text, tmp_path) == ["b.md", "a.md#setup"]
