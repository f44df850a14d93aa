"""The design pages in docs/design/ tie each rule to the code and tests that enforce it;
keep those ties, and every link between the docs, true.

A design document that names files or tests that are gone misleads whoever takes
the project over, so every ``path.py`` and ``path.py::test_name`` a page cites (and the
``::test_name`` shorthand for the file cited just before on the same page) must exist.
A link from the README or a page of docs/ to a file or heading that moved is as
misleading, so every relative link must reach a file, and its ``#anchor`` a heading there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design"
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[A-Za-z0-9_./-]+/[A-Za-z0-9_.-]+\.(py|proto|toml|md|json)$")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _design_pages() -> list[Path]:
    return sorted(DESIGN.glob("*.md"))


def _citations(text: str) -> list[tuple[str, str | None]]:
    """``(file, test)`` pairs in reading order; ``test`` is None for a bare path."""
    cited: list[tuple[str, str | None]] = []
    last_file: str | None = None
    for token in CODE.findall(text):
        path, sep, name = token.partition("::")
        if sep and not path and last_file is not None:
            cited.append((last_file, name))
        elif sep and PATH.match(path):
            last_file = path
            cited.append((path, name))
        elif not sep and PATH.match(token):
            last_file = token
            cited.append((token, None))
    return cited


def _anchors(markdown: str) -> set[str]:
    """The ids GitHub gives the headings of ``markdown`` (``-1``, ``-2`` for repeats)."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        text = re.sub(r"\]\([^)]*\)", "]", heading)  # a link's text stays, its target goes
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _broken_links(page: Path) -> tuple[int, list[str]]:
    """How many relative links ``page`` has, and those that reach no file or heading."""
    checked, broken = 0, []
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        checked += 1
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        reached = file.exists() and (
            not anchor or file.suffix != ".md" or anchor in _anchors(file.read_text())
        )
        if not reached:
            shown = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
            broken.append(f"{shown}: {target}")
    return checked, broken


def test_the_design_doc_cites_things_that_exist() -> None:
    pages = _design_pages()
    assert (DESIGN / "index.md") in pages and len(pages) > 1
    cited = [c for page in pages for c in _citations(page.read_text())]
    # The doc does tie rules to code and tests: the safety rules' table alone cites over
    # 40 files and tests (143 at the split), the pages together over 200 (389).
    assert len(_citations((DESIGN / "protocol.md").read_text())) > 40
    assert len(cited) > 200
    missing = []
    for path, name in cited:
        target = ROOT / path
        if not target.exists():
            missing.append(path)
        elif name is not None and not re.search(
            rf"^\s*(async )?def {re.escape(name.split('[')[0])}\(", target.read_text(), re.M
        ):
            missing.append(f"{path}::{name}")
    assert missing == []


def test_the_index_links_every_design_page() -> None:
    index = (DESIGN / "index.md").read_text()
    linked = {target.partition("#")[0] for target in LINK.findall(index)}
    assert {page.name for page in _design_pages()} - {"index.md"} <= linked


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    results = [_broken_links(page) for page in pages]
    assert sum(checked for checked, _ in results) > 40  # the pages do link to each other
    assert [where for _, broken in results for where in broken] == []


def test_a_link_to_a_missing_file_or_heading_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# Title\n\n## The parts\n\n[ok](#the-parts) [ok](b.md#here) [gone](b.md#gone)\n"
    )
    (tmp_path / "b.md").write_text(
        "## Here\n\n[ok](a.md#title) [gone](c.md) [ok](https://x.org/c.md)\n"
    )
    assert _broken_links(tmp_path / "a.md") == (3, ["a.md: b.md#gone"])
    assert _broken_links(tmp_path / "b.md") == (2, ["b.md: c.md"])


#: The README is the front door (what, the two commands, a tour, links); what grows past
#: this belongs in docs/. It grew back to 20.7 KB once through the generated benchmark table.
README_MAX_BYTES = 20_000


def test_the_readme_stays_a_front_door() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_MAX_BYTES, (
        f"README.md is {size:,} bytes, over {README_MAX_BYTES:,}: move detail to docs/"
    )
    assert not (ROOT / "docs" / "design.md").exists(), "the design lives in docs/design/"
