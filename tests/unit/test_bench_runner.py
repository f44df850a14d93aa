"""``python -m bench`` runs each suite in a fresh process of its own: a JVM (PySpark
keeps one per process) started by an earlier suite would otherwise serve every later
one with its environment and heap, and the S3 suite's s3a writes had no credentials.
This module doubles as the suite the runner is tested with."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import pytest

from bench._load import run_child, run_suite
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


def _silent_child(conn: Connection, pause_s: float) -> None:
    """A child that says one thing, then nothing for ``pause_s``, then its result."""
    conn.send(("progress", "started"))
    time.sleep(pause_s)
    conn.send(("done", "late"))


def test_a_child_silent_longer_than_its_limit_fails_the_run_and_is_ended() -> None:
    """The S3 suite's Spark child is held to a silence limit (``silence_s``): one that
    hangs fails the run instead of holding it, and is killed; one inside it answers."""
    steps: list[str] = []
    with pytest.raises(TimeoutError, match=r"silent child .* said nothing for 1 s"):
        run_child(
            _silent_child,
            (30.0,),
            "silent",
            "the silent child",
            steps.append,
            silence_s=1.0,
            join_s=0.5,
        )
    assert steps == ["started"]
    got = run_child(_silent_child, (0.1,), "quick", "the quick child", steps.append, silence_s=5.0)
    assert got == "late"
