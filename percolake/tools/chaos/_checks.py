"""Checks every workload shares: the oracle's timestamps (rule S7) across restarts.

* No timestamp is handed out twice: start timestamps of all transactions and commit
  timestamps of committed writers are distinct.
* A writer's commit timestamp is above its start timestamp.
* Each process sees its start timestamps increase.
* Real time: a transaction that begins after another completed starts above every
  timestamp that other one held. Oracle restarts must not break any of these.
"""

from __future__ import annotations

from typing import Any

from percolake.tools.chaos._ops import FINAL_PROCESS
from percolake.tools.chaos._workload import CheckResult

#: Examples kept per anomaly type (all are counted).
MAX_EXAMPLES = 20


def check_timestamps(ops: list[dict[str, Any]]) -> CheckResult:
    result = CheckResult("oracle timestamps")
    counts: dict[str, int] = {}

    def flag(kind: str, explanation: str) -> None:
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= MAX_EXAMPLES:
            result.anomalies.append(
                {"check": result.name, "type": kind, "explanation": explanation}
            )

    holders: dict[int, str] = {}
    last_start: dict[int, int] = {}
    floor_at_invoke: dict[int, tuple[int, int]] = {}
    floor, floor_index = 0, -1
    checked = 0
    for op in ops:
        process = op["process"]
        if op["type"] == "invoke":
            floor_at_invoke[process] = (floor, floor_index)
            continue
        start, commit = op.get("start_ts"), op.get("commit_ts")
        before, before_index = floor_at_invoke.pop(process, (0, -1))
        if start is None:
            continue
        checked += 1
        where = f"process {process} at index {op.get('index')}"
        stamps = [("start", start)]
        if commit is not None and commit != start:  # read-only commits reuse start_ts
            stamps.append(("commit", commit))
            if commit < start:
                flag("commit-before-start", f"{where}: commit_ts {commit} < start_ts {start}")
        for label, ts in stamps:
            if ts in holders:
                flag(
                    "duplicate-timestamp",
                    f"{where}: {label} timestamp {ts} was already {holders[ts]}",
                )
            holders[ts] = f"the {label} timestamp of {where}"
        if process != FINAL_PROCESS and process in last_start and start <= last_start[process]:
            flag(
                "non-monotonic-start",
                f"{where}: start_ts {start} not above the process's previous {last_start[process]}",
            )
        last_start[process] = start
        if start <= before:
            flag(
                "stale-start-timestamp",
                f"{where}: start_ts {start} is not above timestamp {before} of the operation "
                f"at index {before_index}, which completed before this one began",
            )
        top = max(ts for _, ts in stamps)
        if top > floor:
            floor, floor_index = top, op.get("index", -1)
    result.stats.update(transactions_with_timestamps=checked, anomaly_counts=counts)
    return result
