"""The README is the front door, not the manual, and no page links to a file that is not there.

`make docs` (MkDocs, --strict) checks the links between the site's pages and their anchors;
this checks what the site never builds: the README's links, and every page's links as a reader
of the files follows them (on GitHub, in an editor), those into the repository outside docs/
included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README_MAX_LINES = 300
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# A Markdown link or image: [text](target) or ![alt](target); the target up to a space or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _relative_links(text: str) -> list[str]:
    """Each link target that names a file of ours: no scheme, not an anchor of the page itself."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return [
        target
        for target in LINK.findall(prose)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
    ]


def test_the_readme_is_at_most_300_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines: the manual goes in docs/, a page by task"
    )


def test_the_readme_names_the_two_commands_and_links_into_the_docs() -> None:
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert any(t.startswith("docs/") for t in _relative_links(text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file(page: Path) -> None:
    missing = []
    for target in _relative_links(page.read_text()):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (page.parent / path).exists():
            missing.append(target)
    assert missing == [], f"{page.relative_to(ROOT)} links to what is not there: {missing}"


def test_the_link_finder_finds_links_and_skips_code() -> None:
    text = (
        "See [Start](docs/start.md), ![a chart](docs/evidence/bench.png "
        '"Bench"), [the web](https://example.com), [here](#top).\n'
        "`[not a link](nowhere.md)`\n```md\n[nor this](nowhere.md)\n```\n"
    )
    assert _relative_links(text) == ["docs/start.md", "docs/evidence/bench.png"]
