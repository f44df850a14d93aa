"""The lakehouse chaos workload's version check (``percolake.tools.chaos._lakehouse``) on
hand-made version histories: a group commit (consecutive versions of one transaction)
is whole whether or not its log records carry a commit timestamp, and a transaction
whose versions have another one's in between is flagged. With expiry (the table's log
retention, ``--lakehouse-log-retention-s``) the final history starts at the oldest
retained version: clean histories pass, and a gap among retained versions, a lost
acknowledged commit, files other than the base plus later adds, and expiry before its
time are flagged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from percolake.tools.chaos._config import RunConfig
from percolake.tools.chaos._lakehouse import (
    TABLE,
    FinalReadRaced,
    LakehouseAppends,
    digest,
    partial_jobs,
)
from percolake.tools.chaos._ops import FINAL_PROCESS
from percolake.tools.chaos._workload import CheckResult

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


# --- with expiry: the final history starts at the oldest retained version -----------

RETENTION_S = 2.0
#: The final read's clock; versions committed a second apart from 1,000 s on.
READ_MS = 2_000_000


def _expiring_run(
    versions: int = 8, oldest: int = 5, unacknowledged: frozenset[int] = frozenset()
) -> tuple[LakehouseAppends, list[dict[str, Any]]]:
    """A clean run of ``versions`` one-job appends (after the create at 0), of which
    versions below ``oldest`` expired: appends acknowledged (except those committed as
    ``unacknowledged`` versions, whose outcome stayed unknown), reads of retained and
    of expired versions, an expire op, and the final read that starts at ``oldest``."""
    config = RunConfig(
        workload="lakehouse", out_dir=Path("unused"), lakehouse_log_retention_s=RETENTION_S
    )
    workload = LakehouseAppends(config)
    commits = [{**_version(0, 1, 2), "app_id": None, "batch_id": None, "added": []}]
    commits += [_version(v, 10 * v, 10 * v + 1) for v in range(1, versions + 1)]
    for c in commits:
        c["timestamp_ms"] = 1_000_000 + 1000 * c["version"]
    ops: list[dict[str, Any]] = []

    def op(process: int, f: str, invoke: Any, done: Any, kind: str = "ok") -> None:
        ops.append({"type": "invoke", "process": process, "f": f, "value": invoke})
        ops.append({"type": kind, "process": process, "f": f, "value": done})

    def read(version: int) -> dict[str, Any]:
        paths = [p for c in commits[: version + 1] for p in c["added"]]
        return {
            "version": version,
            "files": len(paths),
            "digest": digest(paths),
            "partial_jobs": partial_jobs(paths),
        }

    for c in commits[1:]:
        batch = {"app_id": c["app_id"], "batch_id": c["batch_id"], "job": str(c["version"])}
        if c["version"] in unacknowledged:
            op(1, "append", {**batch, "files": 1}, {**batch, "files": 1}, kind="info")
        else:
            done = {**batch, "files": 1, "version": c["version"]}
            op(1, "append", {**batch, "files": 1}, done)
        op(2, "read", None, read(c["version"]))
    op(3, "expire", None, {"readable_from": oldest, "deleted": 12})
    op(2, "read", None, read(versions))
    ops.append({"type": "invoke", "process": 2, "f": "read", "value": None})
    ops.append(
        {
            "type": "fail",
            "process": 2,
            "f": "read",
            "value": None,
            "error": "VersionNotFoundError: version 3 of table 'events' expired",
        }
    )
    retained = commits[oldest:]
    final = {
        "commits": retained,
        "files": [p for c in commits for p in c["added"]],
        "base": [p for c in commits[: oldest + 1] for p in c["added"]],
        "read_ms": READ_MS,
        "log_retention_s": RETENTION_S,
    }
    ops.append({"type": "invoke", "process": FINAL_PROCESS, "f": "history", "value": None})
    ops.append({"type": "ok", "process": FINAL_PROCESS, "f": "history", "value": final})
    return workload, ops


def _final(ops: list[dict[str, Any]]) -> dict[str, Any]:
    value: dict[str, Any] = ops[-1]["value"]
    return value


def _found(workload: LakehouseAppends, ops: list[dict[str, Any]]) -> set[str]:
    return {a["type"] for check in workload.check(ops) for a in check.anomalies}


def test_a_history_that_starts_at_the_oldest_retained_version_is_clean() -> None:
    workload, ops = _expiring_run()
    checks = {c.name: c for c in workload.check(ops)}
    assert all(c.valid for c in checks.values()), [c.anomalies for c in checks.values()]
    assert checks["lakehouse versions"].stats["oldest_retained"] == 5
    assert checks["lakehouse versions"].stats["latest_version"] == 8
    assert checks["lakehouse versions"].stats["jobs"] == 8
    assert checks["lakehouse acknowledged commits"].stats["acknowledged_expired"] == 4
    # Versions 1..4 expired; each was acknowledged to one job whose files the base
    # holds, so every read, of versions 1..8 (8 twice), is compared.
    assert checks["lakehouse acknowledged commits"].stats["reconstructed_versions"] == 5
    assert checks["lakehouse reads"].stats["checked_reads"] == 9
    assert checks["lakehouse reads"].stats["unchecked_reads"] == 0
    assert checks["lakehouse reads"].stats["expired_reads"] == 1
    assert checks["lakehouse expiry"].stats["expire_ops_deleting"] == 1
    assert checks["lakehouse expiry"].stats["expire_ops_raising"] == 1
    assert checks["lakehouse expiry"].stats["oldest_retained"] == 5


def test_a_gap_among_retained_versions_is_flagged() -> None:
    workload, ops = _expiring_run()
    del _final(ops)["commits"][2]  # version 7
    assert "version-gap" in _found(workload, ops)


def test_a_history_that_skips_its_start_without_a_base_is_flagged() -> None:
    """A history recorded without a base must start at version 0."""
    workload, ops = _expiring_run()
    del _final(ops)["base"]
    assert "version-gap" in _found(workload, ops)


def test_a_missing_acknowledged_retained_commit_is_flagged() -> None:
    workload, ops = _expiring_run()
    final = _final(ops)
    gone = final["commits"][-1]
    final["commits"] = final["commits"][:-1]
    final["files"] = [p for p in final["files"] if p not in gone["added"]]
    assert "lost-acknowledged-commit" in _found(workload, ops)


def test_an_acknowledged_expired_commit_missing_from_the_base_is_flagged() -> None:
    workload, ops = _expiring_run()
    final = _final(ops)
    lost = "t/_lh_job=2/part-0-of-1.parquet"  # version 2 expired; its job must be in the base
    final["base"].remove(lost)
    final["files"].remove(lost)
    found = _found(workload, ops)
    assert "lost-acknowledged-commit" in found


def test_latest_files_other_than_base_plus_adds_are_flagged() -> None:
    workload, ops = _expiring_run()
    _final(ops)["files"].append("t/_lh_job=99/part-0-of-1.parquet")
    assert "files-mismatch" in _found(workload, ops)
    workload, ops = _expiring_run()
    _final(ops)["files"].remove("t/_lh_job=3/part-0-of-1.parquet")  # an expired version's
    assert "files-mismatch" in _found(workload, ops)


def test_a_job_of_an_expired_version_added_again_is_a_duplicate() -> None:
    workload, ops = _expiring_run()
    final = _final(ops)
    final["commits"][-1]["added"].append("t/_lh_job=2/part-0-of-1.parquet")
    assert "duplicate-commit" in _found(workload, ops)


def test_a_read_that_disagrees_with_a_retained_version_is_flagged() -> None:
    workload, ops = _expiring_run()
    read = next(
        op for op in ops if op["f"] == "read" and op["value"] and op["value"]["version"] == 6
    )
    read["value"] = {**read["value"], "digest": read["value"]["digest"] + 1}
    assert "read-not-version" in _found(workload, ops)


def test_expiry_before_the_retention_ran_out_is_flagged() -> None:
    """Version 4 expired; version 5 replaced it at 1,005 s, so a final read at 1,006 s
    is within the 2 s retention: it should still be readable."""
    workload, ops = _expiring_run()
    _final(ops)["read_ms"] = 1_006_000
    assert "premature-expiry" in _found(workload, ops)


def test_a_history_below_a_reported_expiry_bound_is_flagged() -> None:
    workload, ops = _expiring_run()
    expire = next(op for op in ops if op["f"] == "expire" and op["type"] == "ok")
    expire["value"] = {**expire["value"], "readable_from": 7}
    assert "expired-version-in-history" in _found(workload, ops)


def test_a_read_of_a_version_below_a_reported_expiry_bound_is_flagged() -> None:
    workload, ops = _expiring_run()
    ops.insert(-2, {"type": "invoke", "process": 4, "f": "read", "value": None})
    stale = {"version": 3, "files": 3, "digest": 0, "partial_jobs": []}
    ops.insert(-2, {"type": "ok", "process": 4, "f": "read", "value": stale})
    assert "read-of-expired-version" in _found(workload, ops)


def test_the_log_retention_option_must_be_a_finite_non_negative_number() -> None:
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--lakehouse-log-retention-s"):
            RunConfig(workload="lakehouse", out_dir=Path("x"), lakehouse_log_retention_s=bad)
    with pytest.raises(ValueError, match="--workload lakehouse only"):
        RunConfig(workload="bank", out_dir=Path("x"), lakehouse_log_retention_s=2.0)
    assert (
        RunConfig(
            workload="lakehouse", out_dir=Path("x"), lakehouse_log_retention_s=0
        ).lakehouse_log_retention_s
        == 0
    )


def test_reads_of_expired_versions_past_an_unacknowledged_one_are_unchecked() -> None:
    """Version 3's append ended unknown: versions 3 and 4 expired with no client told
    which job they added, so reads of them cannot be compared; 1 and 2 still are."""
    workload, ops = _expiring_run(unacknowledged=frozenset({3}))
    checks = {c.name: c for c in workload.check(ops)}
    assert all(c.valid for c in checks.values()), [c.anomalies for c in checks.values()]
    assert checks["lakehouse acknowledged commits"].stats["reconstructed_versions"] == 3
    assert checks["lakehouse reads"].stats["checked_reads"] == 7
    assert checks["lakehouse reads"].stats["unchecked_reads"] == 2


def test_a_read_that_disagrees_with_an_expired_acknowledged_version_is_flagged() -> None:
    workload, ops = _expiring_run()
    read = next(
        op for op in ops if op["f"] == "read" and op["value"] and op["value"]["version"] == 2
    )
    read["value"] = {**read["value"], "files": 1}
    assert "read-not-version" in _found(workload, ops)


def test_a_base_with_files_no_expired_version_was_acknowledged_for_is_flagged() -> None:
    workload, ops = _expiring_run()
    stray = "t/_lh_job=77/part-0-of-1.parquet"
    _final(ops)["base"].append(stray)
    _final(ops)["files"].append(stray)
    assert "base-mismatch" in _found(workload, ops)


def test_one_expired_version_acknowledged_to_two_jobs_is_flagged() -> None:
    workload, ops = _expiring_run()
    acks = [op for op in ops if op["f"] == "append" and op["type"] == "ok"]
    acks[1]["value"] = {**acks[1]["value"], "version": acks[0]["value"]["version"]}
    assert "version-acknowledged-twice" in _found(workload, ops)


def test_a_read_back_in_time_is_stale_only_if_the_latest_it_saw_was() -> None:
    """A read back (time travel) reads the latest version, then one ``back`` before it:
    an old version is no stale read, unless the latest it started from was old."""
    workload, ops = _expiring_run()
    read = next(
        op for op in ops if op["f"] == "read" and op["value"] and op["value"]["version"] == 6
    )
    past = dict(read["value"])
    ops.insert(-2, {"type": "invoke", "process": 4, "f": "read", "value": {"back": 2}})
    ops.insert(-2, {"type": "ok", "process": 4, "f": "read", "value": {**past, "back": 2}})
    assert _found(workload, ops) == set()
    ops[-3]["value"]["back"] = 1  # started from version 7, after 8 was acknowledged
    assert "stale-read" in _found(workload, ops)


def test_a_commit_landing_during_the_final_read_makes_it_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3-node run flagged files-mismatch: a gateway finished a DELETE its client had
    given up on between the final read's history and its listing of the latest files,
    so the listing showed a version the history lacked. The final read now checks that
    the head did not move, and the harness reads again when it did."""
    pytest.importorskip("pyspark")
    from spark_integration import DataFile
    from txn import TransactionManager

    workload = LakehouseAppends(RunConfig(workload="lakehouse", out_dir=tmp_path))
    warehouse = str(tmp_path / "warehouse")
    real_open = LakehouseAppends.open_lakehouse
    landed: list[int] = []

    def open_racing(manager: Any, where: str, timeout_s: float, *, slot: int | None = None) -> Any:
        lh = real_open(manager, where, timeout_s, slot=slot)
        listing = lh.files

        def files(name: str, version: int | None = None) -> Any:
            if version is None and not landed:  # the latest listing, after the history
                job = tmp_path / "warehouse" / TABLE / "_lh_job=0-1"
                job.mkdir(parents=True)
                (job / "part-0-of-1.parquet").write_bytes(b"x")
                path = str(job / "part-0-of-1.parquet")
                landed.append(lh.append_files(name, [DataFile(path, 1, 1)]))
            return listing(name, version)

        lh.files = files
        return lh

    tm = TransactionManager.embedded(f"sqlite:///{tmp_path}/store.db")
    try:
        workload.setup(tm, warehouse)
        monkeypatch.setattr(LakehouseAppends, "open_lakehouse", staticmethod(open_racing))
        with pytest.raises(FinalReadRaced, match="version 1 was committed during the final"):
            workload.final_read(tm, [], warehouse)
        # Read again (as the harness does): the history now holds the version.
        (_, ok) = workload.final_read(tm, [], warehouse)
        assert [c["version"] for c in ok["value"]["commits"]] == [0, 1]
        assert ok["value"]["files"] == ["_lh_job=0-1/part-0-of-1.parquet"]
    finally:
        tm.close()
