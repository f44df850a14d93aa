"""The lakehouse chaos workload's version check (``percolake.chaos._lakehouse``) on
hand-made version histories: a group commit (consecutive versions of one transaction)
is whole whether or not its log records carry a commit timestamp, and a transaction
whose versions have another one's in between is flagged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from percolake.chaos._config import RunConfig
from percolake.chaos._lakehouse import LakehouseAppends
from percolake.chaos._workload import CheckResult

pytestmark = pytest.mark.unit


def _version(version: int, txn: int, commit_ts: int | None) -> dict[str, Any]:
    return {
        "version": version,
        "commit_ts": commit_ts,
        "txn_start_ts": txn,
        "app_id": f"app-{version}",
        "batch_id": version,
        "added": [f"t/_lh_job={version}/part-0-of-1.parquet"],
        "removed": 0,
    }


def _check(commits: list[dict[str, Any]]) -> CheckResult:
    workload = LakehouseAppends(RunConfig(workload="lakehouse", out_dir=Path("unused")))
    result = CheckResult("lakehouse versions")
    latest = [path for c in commits for path in c["added"]]
    workload._check_versions(result, commits, latest)
    return result


def test_a_group_commit_without_commit_stamps_is_consecutive() -> None:
    """Found by a chaos run: versions 12 and 13 of one group commit carried no
    commit_ts, and the check compared with the last stamped version (11) instead."""
    commits = [
        _version(0, 4, 5),
        _version(1, 10, 11),
        _version(2, 20, None),
        _version(3, 20, None),
        _version(4, 30, 31),
    ]
    result = _check(commits)
    assert result.valid, result.anomalies
    assert result.stats["grouped_versions"] == 2


def test_a_transaction_split_by_another_is_flagged() -> None:
    commits = [_version(0, 4, 5), _version(1, 10, None), _version(2, 20, 21), _version(3, 10, None)]
    types = {a["type"] for a in _check(commits).anomalies}
    assert "group-not-consecutive" in types
