"""The restart benchmark (issue 30, item 10) is registered and reports the contract's
figures, each from the values of its repetitions."""

from __future__ import annotations

import pytest

from bench import bench_restart
from bench.__main__ import SUITES
from bench._results import Figure
from bench.report import CONTRACT_FIGURES

pytestmark = pytest.mark.unit


def test_the_suite_is_registered_and_its_figures_are_the_contracts() -> None:
    assert "bench.bench_restart" in SUITES
    for name in ("serve.restart_after_kill.first_commit_s", "serve.cold_start.first_commit_s"):
        assert name in CONTRACT_FIGURES


def test_each_figure_is_the_median_of_its_repetitions(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = iter(
        [
            {"cold_start": 0.4, "restart_after_kill": 0.3, "restart_after_term": 0.2},
            {"cold_start": 0.6, "restart_after_kill": 0.9, "restart_after_term": 0.4},
            {"cold_start": 0.5, "restart_after_kill": 0.5, "restart_after_term": 0.3},
        ]
    )
    monkeypatch.setattr(bench_restart, "measure_once", lambda root: next(runs))
    figures = {f.name: f for f in bench_restart.run(quick=True) if isinstance(f, Figure)}
    assert len(figures) == 3
    assert figures["serve.cold_start.first_commit_s"].value == 0.5
    assert figures["serve.restart_after_kill.first_commit_s"].value == 0.5
    assert figures["serve.restart_after_term.first_commit_s"].value == 0.3
    assert all(f.runs == 3 and f.unit == "s" for f in figures.values())
