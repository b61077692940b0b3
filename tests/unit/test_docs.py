"""The documentation a newcomer reads: short README, links that lead somewhere, the two commands.

Every relative link in README.md, CONTRIBUTING.md and docs/**/*.md must name a file or folder
that exists in the clone (anchors are not checked: a renamed heading is a smaller harm than a
missing file). Links inside fenced code blocks and inline code are not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 250

# [text](target) and [text](target "title"); images too (![alt](target)).
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
EXTERNAL = ("http://", "https://", "mailto:")


def documents() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [README, ROOT / "CONTRIBUTING.md", *docs]


def relative_links(text: str) -> list[str]:
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = []
    for target in LINK.findall(prose):
        if target.startswith(EXTERNAL) or target.startswith("#"):
            continue
        path = unquote(target.split("#", 1)[0])
        if path:
            targets.append(path)
    return targets


def test_the_documents_checked_are_there() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in documents()}
    assert {"README.md", "CONTRIBUTING.md", "docs/architecture.md", "docs/contract.md"} <= names
    for path in documents():
        assert path.is_file(), path


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_names_a_file_that_exists(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    missing = [
        target
        for target in relative_links(text)
        if not (document.parent / target).resolve().exists()
    ]
    assert missing == [], f"{document.relative_to(ROOT)} links to missing files: {missing}"


def test_every_link_stays_inside_the_clone() -> None:
    outside = []
    for document in documents():
        for target in relative_links(document.read_text(encoding="utf-8")):
            resolved = (document.parent / target).resolve()
            if not resolved.is_relative_to(ROOT):
                outside.append(f"{document.relative_to(ROOT)} -> {target}")
    assert outside == []


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_gives_the_two_set_up_commands() -> None:
    text = README.read_text(encoding="utf-8")
    fenced = [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL)]
    assert "./run" in fenced
    assert "./test" in fenced


def test_the_link_finder_finds_links_and_skips_code() -> None:
    text = (
        'See [a](docs/a.md#x) and ![b](img/b.png "title") [c](https://e.org) [d](#here).\n'
        "`[e](inline.md)`\n```sh\n[f](fenced.md)\n```\n[g](../up%20one.md)\n"
    )
    assert relative_links(text) == ["docs/a.md", "img/b.png", "../up one.md"]
