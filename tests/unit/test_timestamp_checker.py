"""The timestamp history checker (the chaos ``timestamps`` workload, ``percolake check``).

Histories here are hand-made: each call is an invocation and a completion of one
process at given times (nanoseconds), as the chaos clients record them.
"""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from percolake.tools.checker import (
    TimestampHistoryError,
    check_timestamp_history,
    is_timestamp_history,
    run_check,
)

pytestmark = pytest.mark.unit

MS = 1_000_000


def call(
    process: int, invoke_ms: float, complete_ms: float, ts: int | None, node: str = "any"
) -> list[dict[str, Any]]:
    """One call: its invocation and its completion (``ts`` None: it failed)."""
    done: dict[str, Any] = {
        "type": "ok" if ts is not None else "info",
        "f": "ts",
        "value": ts,
        "process": process,
        "time": int(complete_ms * MS),
        "node": node,
    }
    invoke = {"type": "invoke", "f": "ts", "value": None, "process": process}
    return [{**invoke, "time": int(invoke_ms * MS)}, done]


def history(*calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events of all calls in time order, numbered as the harness numbers them."""
    ops = sorted((op for c in calls for op in c), key=lambda op: op["time"])
    for index, op in enumerate(ops):
        op["index"] = index
    return ops


def test_sequential_and_concurrent_calls_in_order_are_valid() -> None:
    report = check_timestamp_history(
        history(
            call(0, 0, 10, 1),
            call(1, 5, 20, 3),  # concurrent with the first: any order
            call(2, 6, 8, 2),
            call(0, 30, 40, 7),
            call(1, 31, 35, None),  # failed: not checked
        )
    )
    assert report.valid, report.render_text()
    assert report.stats["calls_ok"] == 4 and report.stats["calls_not_ok"] == 1
    assert report.stats["processes"] == 3


def test_a_timestamp_below_one_received_before_the_call_began_is_caught() -> None:
    report = check_timestamp_history(
        history(
            call(0, 0, 10, 100, node="leader"),
            call(1, 12, 14, 200, node="new-leader"),
            call(2, 20, 25, 150, node="woken-old-leader"),  # began after 200 was received
        )
    )
    assert not report.valid
    assert report.counts == {"real-time-order": 1}
    (violation,) = report.violations
    assert violation.later.ts == 150 and violation.later.node == "woken-old-leader"
    assert violation.earlier.ts == 200  # the highest timestamp received before it began
    assert "6.000 ms before" in violation.explanation
    assert report.stats["stale_calls_by_node"] == {"woken-old-leader": 1}
    assert report.stats["largest_step_back"] == 50
    text = report.render_text()
    assert "INVALID" in text and "process 2 via woken-old-leader" in text


def test_a_duplicate_is_caught_even_between_concurrent_calls() -> None:
    report = check_timestamp_history(history(call(0, 0, 10, 5), call(1, 1, 9, 5)))
    assert report.counts == {"duplicate-timestamp": 1}


def test_nemesis_operations_are_skipped_and_malformed_ones_refused() -> None:
    ops = history(call(0, 0, 1, 1))
    ops.insert(0, {"type": "info", "process": "nemesis", "f": "start", "value": "x", "time": 0})
    assert check_timestamp_history(ops).valid
    bad = history(call(0, 0, 1, 1))
    bad[1]["value"] = "one"
    with pytest.raises(TimestampHistoryError, match="its timestamp"):
        check_timestamp_history(bad)
    with pytest.raises(TimestampHistoryError, match="never invoked"):
        check_timestamp_history(history(call(0, 0, 1, 1))[1:])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 50)), min_size=1, max_size=40))
def test_the_sweep_agrees_with_checking_every_pair(spans: list[tuple[int, int]]) -> None:
    """Timestamps of a counter that may be read out of order: the O(n log n) sweep
    flags exactly the calls that some pair check flags."""
    calls = []
    for process, (start, length) in enumerate(spans):
        # A timestamp that usually follows the completion order, sometimes not.
        ts = (start + length) * 10 + process if process % 7 else 5000 - process
        calls.append((process, start, start + length, ts))
    report = check_timestamp_history(history(*(call(p, i, c, t) for p, i, c, t in calls)))
    stale = {b[0] for b in calls for a in calls if a is not b and a[2] < b[1] and a[3] >= b[3]}
    assert report.counts.get("real-time-order", 0) == len(stale)


def test_percolake_check_reads_a_timestamps_history(tmp_path: Path) -> None:
    path = tmp_path / "timestamps.jsonl"
    path.write_text(
        "".join(
            json.dumps(op) + "\n"
            for op in history(call(0, 0, 10, 100), call(1, 12, 14, 200), call(2, 20, 25, 150))
        )
    )
    assert is_timestamp_history(path)
    out = StringIO()
    assert run_check(str(path), "snapshot-isolation", as_json=True, out=out) == 1
    report = json.loads(out.getvalue())
    assert report["kind"] == "timestamps" and report["violation_counts"] == {"real-time-order": 1}
    assert report["violations"][0]["earlier"]["ts"] == 200
    path.write_text("".join(json.dumps(op) + "\n" for op in history(call(0, 0, 10, 100))))
    out = StringIO()
    assert run_check(str(path), "serializable", as_json=False, out=out) == 0
    assert "VALID" in out.getvalue()
    path.write_text('{"type": "invoke", "f": "ts", "process": 0, "time": "soon"}\n')
    assert run_check(str(path), "serializable", as_json=False, out=StringIO()) == 2
