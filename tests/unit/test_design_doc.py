"""docs/design.md ties each rule to the code and tests that enforce it; keep those ties true.

A design document that names files or tests that are gone misleads whoever takes
the project over, so every ``path.py`` and ``path.py::test_name`` it cites (and the
``::test_name`` shorthand for the file cited just before) must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[A-Za-z0-9_./-]+/[A-Za-z0-9_.-]+\.(py|proto|toml|md|json)$")


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


def test_the_design_doc_cites_things_that_exist() -> None:
    cited = _citations((ROOT / "docs" / "design.md").read_text())
    assert len(cited) > 40  # the doc does tie rules to code and tests
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
