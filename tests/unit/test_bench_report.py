"""The README's benchmark table is the committed results file, rendered."""

from __future__ import annotations

import json

import pytest

from bench.report import README, RESULTS, readme_with_table

pytestmark = pytest.mark.unit


def test_readme_table_matches_the_committed_results() -> None:
    results = json.loads(RESULTS.read_text())
    readme = README.read_text()
    assert readme_with_table(readme, results) == readme, (
        "run: python -c 'from bench.report import update_readme; update_readme()'"
    )


def test_every_figure_says_runs_spread_and_anchor() -> None:
    for figure in json.loads(RESULTS.read_text())["figures"]:
        assert {"name", "value", "unit", "runs", "spread", "anchor"} <= figure.keys(), figure
        assert figure["runs"] >= 1
