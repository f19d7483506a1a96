"""The documentation builds and its links hold: the MkDocs site under docs/ builds with --strict
(a broken link or anchor, a page missing from nav, a reference page whose module moved, all fail
it), and every relative link of the README, which GitHub renders outside the site, points at a
file that exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 300  # an entry point, not the manual: the rest is docs/

# [text](target) and ![alt](target), the target up to its first space or closing parenthesis
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(markdown: str) -> list[str]:
    """The links of a Markdown text that point into the repository: no URL, no bare #anchor,
    nothing inside a code block or span."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [target for target in MARKDOWN_LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I) and not target.startswith("#")]


@pytest.mark.unit
def test_relative_links_are_found_inside_code_and_outside_it():
    text = ("See [the docs](docs/a.md#part), ![a plot](docs/b.png \"title\") and [site](https://x.org),"
            " [top](#two-commands); `[not](a link)`\n```\n[nor](this)\n```\n")
    assert relative_links(text) == ["docs/a.md#part", "docs/b.png"]


@pytest.mark.unit
def test_every_relative_link_of_the_readme_points_at_a_file_that_exists():
    links = relative_links(README.read_text())
    assert links, "the README links its documentation pages"
    missing = [link for link in links if not (ROOT / link.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links files that do not exist: {missing}"


@pytest.mark.unit
def test_the_readme_stays_an_entry_point():
    lines = len(README.read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines (under {README_MAX_LINES}): move the detail into docs/"


@pytest.mark.integration
def test_the_documentation_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: warnings (a broken link or anchor, a page not in nav, a docstring
    mkdocstrings cannot render) fail the build."""
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
