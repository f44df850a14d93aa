"""The lakehouse chaos workload's rewrite checks (``_lakehouse_rewrites``) on hand-made
histories: appends, a row delete and a compaction, checked clean; then the broken
builds the checks are there for, each of which must be flagged: a delete that dropped
rows it did not claim, a compaction that lost a file's rows, a rewrite whose version
removed other files than it read, two rewrites of one file that both committed, a
rewrite that failed yet committed or left its file, and a deleted row brought back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from percolake.tools.chaos._config import RunConfig
from percolake.tools.chaos._lakehouse import LakehouseAppends
from percolake.tools.chaos._lakehouse_rewrites import output_of, row_ids
from percolake.tools.chaos._ops import FINAL_PROCESS

pytestmark = pytest.mark.unit

ROWS = 10  # RunConfig's rows_per_file


def _files(job: str, k: int = 2) -> list[str]:
    return [f"_lh_job={job}/part-{i}-of-{k}.parquet" for i in range(k)]


def _rows(paths: list[str]) -> list[int]:
    return [i for p in paths for i in row_ids(p, ROWS)]


class Run:
    """Versions 1-3 append jobs 1-1, 2-1 and 1-2; version 4 deletes two rows of 1-1
    (rewrite d2-2), version 5 compacts 2-1 with d2-2's file (rewrite c1-3)."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.commits: list[dict[str, Any]] = [self._version(0, "CREATE TABLE", [], [])]
        self.contents: dict[str, list[int]] = {}
        for job in ("1-1", "2-1", "1-2"):
            version = len(self.commits)
            batch = {"app_id": f"chaos-{job}", "batch_id": version, "job": job, "files": 2}
            self.commits.append(
                {**self._version(version, "WRITE", _files(job), []), **self._batch(batch)}
            )
            self._op("append", batch, {**batch, "version": version})
        deleted = _rows(_files("1-1"))[3:5]
        self.rewrite("delete", "d2-2", _files("1-1"), deleted)
        self.rewrite("compact", "c1-3", [*_files("2-1"), output_of("d2-2")], [])

    @staticmethod
    def _batch(batch: dict[str, Any]) -> dict[str, Any]:
        return {"app_id": batch["app_id"], "batch_id": batch["batch_id"]}

    @staticmethod
    def _version(v: int, operation: str, added: list[str], removed: list[str]) -> dict[str, Any]:
        return {
            "version": v,
            "commit_ts": 10 * v + 1,
            "txn_start_ts": 10 * v,
            "operation": operation,
            "app_id": None,
            "batch_id": None,
            "added": sorted(added),
            "removed": len(removed),
            "removed_files": sorted(removed),
        }

    def _op(self, f: str, invoke: Any, done: Any, kind: str = "ok") -> None:
        self.ops.append({"type": "invoke", "process": 1, "f": f, "value": invoke})
        self.ops.append({"type": kind, "process": 1, "f": f, "value": done})

    def rows_of(self, path: str) -> list[int]:
        return self.contents[path] if path in self.contents else _rows([path])

    def rewrite(self, f: str, job: str, removed: list[str], deleted: list[int]) -> None:
        version = len(self.commits)
        operation = "DELETE" if f == "delete" else "OPTIMIZE"
        kept = [i for p in removed for i in self.rows_of(p) if i not in deleted]
        self.contents[output_of(job)] = kept
        self.commits.append(self._version(version, operation, [output_of(job)], removed))
        detail = {"job": job, "seed": 1, "read_version": version - 1, "removed": removed}
        self._op(f, {"job": job, "seed": 1}, {**detail, "deleted": deleted, "version": version})

    def history(self) -> list[dict[str, Any]]:
        files: set[str] = set()
        for c in self.commits:
            files = (files - set(c["removed_files"])) | set(c["added"])
        final = {
            "commits": self.commits,
            "files": sorted(files),
            "base": [],
            "rewrite_rows": dict(self.contents),
            "stored_rewrites": sorted(self.contents),
        }
        done = {"type": "ok", "process": FINAL_PROCESS, "f": "history", "value": final}
        return [*self.ops, {**done, "type": "invoke", "value": None}, done]


def _checks(ops: list[dict[str, Any]]) -> dict[str, Any]:
    workload = LakehouseAppends(RunConfig(workload="lakehouse", out_dir=Path("unused")))
    return {c.name: c for c in workload.check(ops)}


def _found(ops: list[dict[str, Any]]) -> set[str]:
    return {a["type"] for c in _checks(ops).values() for a in c.anomalies}


def test_appends_a_delete_and_a_compaction_check_clean() -> None:
    checks = _checks(Run().history())
    assert all(c.valid for c in checks.values()), [c.anomalies for c in checks.values()]
    stats = checks["lakehouse rewrites"].stats
    assert (stats["delete_ok"], stats["compact_ok"], stats["rewrite_versions"]) == (1, 1, 2)
    assert stats["rows_deleted"] == 2 and stats["latest_rows"] == 3 * 2 * ROWS - 2
    assert stats["row_checked_versions"] == 5


def test_a_delete_that_dropped_rows_it_did_not_claim_is_flagged() -> None:
    run = Run()
    run.contents[output_of("d2-2")] = run.contents[output_of("d2-2")][1:]
    assert "rows-mismatch" in _found(run.history())


def test_a_compaction_that_lost_a_file_is_flagged() -> None:
    run = Run()
    lost = set(_rows(_files("2-1")[:1]))
    run.contents[output_of("c1-3")] = [i for i in run.contents[output_of("c1-3")] if i not in lost]
    assert {"rows-mismatch", "lost-acknowledged-row"} <= _found(run.history())


def test_a_rewrite_version_that_removed_other_files_than_it_read_is_flagged() -> None:
    run = Run()
    compaction = run.commits[5]
    compaction["removed_files"] = compaction["removed_files"][1:]
    compaction["removed"] -= 1
    assert "rewrite-mismatch" in _found(run.history())


def test_two_rewrites_of_one_file_that_both_committed_are_flagged() -> None:
    """A lost update: a second delete read job 1-1 at version 3, as the first did, and
    committed after it, bringing back the row the first one deleted."""
    run = Run()
    run.rewrite("delete", "d3-4", _files("1-1"), _rows(_files("1-1"))[7:8])
    # What such a version holds: the files its read set named were no longer live.
    run.commits[-1]["removed_files"], run.commits[-1]["removed"] = [], 0
    run.contents[output_of("d3-4")] = [
        i for i in _rows(_files("1-1")) if i != _rows(_files("1-1"))[7]
    ]
    found = _found(run.history())
    assert {"rewrite-mismatch", "rows-mismatch", "deleted-row-visible"} <= found


def test_a_failed_rewrite_that_committed_or_left_its_file_is_flagged() -> None:
    run = Run()
    compaction = run.ops[-1]
    compaction["type"] = "fail"
    assert {"failed-rewrite-visible", "failed-rewrite-left-file"} <= _found(run.history())
    run = Run()
    run.ops.append({"type": "invoke", "process": 2, "f": "delete", "value": {"job": "d9-9"}})
    run.ops.append({"type": "fail", "process": 2, "f": "delete", "value": {"job": "d9-9"}})
    history = run.history()
    history[-1]["value"]["stored_rewrites"].append(output_of("d9-9"))
    assert _found(history) == {"failed-rewrite-left-file"}
    run.ops[-1]["value"] = {"job": "d9-9", "left_file": True}  # the op says its removal failed
    history = run.history()
    history[-1]["value"]["stored_rewrites"].append(output_of("d9-9"))
    assert _found(history) == set()


def test_a_rewrite_of_unknown_outcome_may_have_committed_or_not() -> None:
    run = Run()
    run.ops[-1]["type"] = "info"
    assert _found(run.history()) == set()
    run = Run()
    run.ops[-1] = {**run.ops[-1], "type": "info", "value": {"job": "c1-3", "seed": 1}}
    assert _found(run.history()) == set()  # no detail: the version's own removals count
