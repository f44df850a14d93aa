"""The folders show the layers: at most one import arrow runs back up between folders.

Issue 29: drawn as a graph of imports between top-level folders, each on the floor
above everything it imports, 6 arrows ran back up (every building block imported the
application package for its error root, metrics and wire code). ``scripts/import_graph.py``
counts them; the layer contracts keep them from coming back, and this test says so in
the numbers the issue asked for.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import grimp
import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "import_graph", ROOT / "scripts" / "import_graph.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_at_most_one_arrow_runs_back_up_between_folders() -> None:
    script = _script()
    graph = grimp.build_graph(*script.PACKAGES, cache_dir=None)
    up = {
        label: script.floors(script.folder_arrows(graph, inside, depth))[1]
        for label, inside, depth in script.LEVELS
    }
    # The one allowed: `percolake bench` runs the bench runner, which drives the tools.
    assert up["top level"] == [("bench", "percolake")]
    assert {label: arrows for label, arrows in up.items() if label != "top level"} == {
        label: [] for label in up if label != "top level"
    }


def test_the_count_sees_a_cycle() -> None:
    """Two folders importing each other cost one arrow up whatever the order."""
    script = _script()
    order, up = script.floors({("a", "b"), ("b", "a"), ("b", "c")})
    assert len(up) == 1 and set(order) == {"a", "b", "c"}
