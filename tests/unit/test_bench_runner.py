"""``python -m bench`` runs each suite in a fresh process of its own: a JVM (PySpark
keeps one per process) started by an earlier suite would otherwise serve every later
one with its environment and heap, and the S3 suite's s3a writes had no credentials.
This module doubles as the suite the runner is tested with."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from bench._load import run_suite
from bench._results import Figure, Result

pytestmark = pytest.mark.unit

#: Set here after the runner starts, so a suite running in this process would see it.
PARENT_ONLY = "PERCOLAKE_TEST_BENCH_RUNNER_PARENT_ONLY"


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    """A suite: its process id as a figure, whether it saw the parent's late variable,
    and with ``quick`` False a failure."""
    progress("step one")
    if not quick:
        raise ValueError("the suite failed on purpose")
    return [
        Figure("pid", float(os.getpid()), "pid", 1, 0.0, "none"),
        Figure("saw_parent_variable", float(PARENT_ONLY in os.environ), "bool", 1, 0.0, "none"),
    ]


def test_a_suite_runs_in_its_own_process_and_its_results_and_progress_come_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[str] = []
    got = run_suite(__name__, True, steps.append)
    assert steps == ["step one"]
    figures = {f.name: f.value for f in got if isinstance(f, Figure)}
    assert figures["pid"] != os.getpid()
    assert figures["saw_parent_variable"] == 0.0
    # A fresh process takes the environment as it is when the suite starts.
    monkeypatch.setenv(PARENT_ONLY, "1")
    got = run_suite(__name__, True, steps.append)
    assert {f.name: f.value for f in got if isinstance(f, Figure)}["saw_parent_variable"] == 1.0


def test_a_failing_suite_fails_the_run_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match="the suite failed on purpose"):
        run_suite(__name__, False, lambda _: None)
