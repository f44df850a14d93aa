"""The lakehouse workload: concurrent metadata-only appends to one table, and readers.

Clients commit through ``spark_integration.Lakehouse.append_files`` (no Spark: the file
lists are made up, which is all the metadata layer sees) with an ``(app_id, batch_id)``
on every commit, and replay a batch whose outcome was unknown, exactly as a restarted
Spark job would. Readers take ``version`` then ``files(version)``. The checks:

* versions are dense, and each one adds whole commits: every file of a job, or none;
* no job and no ``(app_id, batch_id)`` appears in two versions (replays add nothing);
* every acknowledged append is in the final history at the version it was told, and a
  batch whose every attempt definitely failed is not;
* every read of version ``v`` saw exactly the files of versions ``0..v``, and no read
  saw an older version than one acknowledged before it began (no stale reads);
* commit timestamps follow the version number: a version's is above the one before
  it, or equal when both were committed by one transaction (a group commit), whose
  versions are consecutive.

Half the clients run the commit protocol in their own process (oracle and lock server
remote, store shared). The others go through the gateways, as Spark drivers do: most
through the gateways' ``LakehouseService`` (``Lakehouse`` on a remote manager, what
users get), where appends that meet at a gateway are group-committed and a commit
whose reply was lost is sent again with the same job id; they move to the next
gateway when one fails. Every fourth client slot (2, 6, ...) instead runs the catalog
itself over a manager that fails over between the gateways' transaction services
(``gateway_catalog=False``). ``Lakehouse`` has no metadata-only overwrite, so the
workload appends only.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from percolake.chaos._ops import FINAL_PROCESS, Completion, describe
from percolake.chaos._workload import CheckResult, ClientContext, Workload
from txn import Manager, TransactionManager
from txn.errors import TransactionAbortedError

TABLE = "events"
_JOB_PREFIX = "_lh_job="


_DIGEST_MOD = 1 << 64


def _path_hash(path: str) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big")


def digest(paths: Iterable[str], start: int = 0) -> int:
    """A fingerprint of a set of file paths: the sum of their hashes, so that the
    fingerprint of each version follows from the previous one plus what it added."""
    return (start + sum(_path_hash(p) for p in paths)) % _DIGEST_MOD


def partial_jobs(paths: Iterable[str]) -> list[str]:
    """Jobs of which ``paths`` holds some files but not all."""
    parts: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for path in paths:
        job, part, count = _job_of(path)
        parts.setdefault(job, set()).add(part)
        counts[job] = count
    return sorted(job for job, got in parts.items() if got != set(range(counts[job])))


def _job_of(path: str) -> tuple[str, int, int]:
    """``(job, part, parts)`` of ``.../_lh_job=<job>/part-<i>-of-<k>.parquet``."""
    folder, name = path.rsplit("/", 2)[-2:]
    job = folder.removeprefix(_JOB_PREFIX)
    _, part, _, parts = name.removesuffix(".parquet").split("-")
    return job, int(part), int(parts)


class LakehouseAppends(Workload):
    name = "lakehouse"
    history_name = "lakehouse.jsonl"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replay: dict[str, Any] | None = None

    @staticmethod
    def open_lakehouse(
        manager: Manager, warehouse: str, timeout_s: float, *, slot: int | None = None
    ) -> Any:
        """The lakehouse a client (``slot``) or the harness (no slot) commits with."""
        lakehouse = _spark_integration().Lakehouse
        remotes = getattr(manager, "remote_managers", None)
        if remotes is None:
            return lakehouse(manager, warehouse, catalog="chaos", commit_timeout_s=timeout_s)
        if slot is not None and slot % 4 == 2:
            return lakehouse(
                manager,
                warehouse,
                catalog="chaos",
                commit_timeout_s=timeout_s,
                gateway_catalog=False,
            )
        return ServiceLakehouses(
            [
                lakehouse(remote, warehouse, catalog="chaos", commit_timeout_s=timeout_s)
                for remote in remotes
            ]
        )

    def generate(
        self, rng: random.Random, elapsed_s: float, process: int, counter: int
    ) -> tuple[str, Any]:
        if self._replay is not None:
            return "append", {**self._replay, "replay": True}
        if rng.random() < 0.3:
            return "read", None
        return "append", {
            "app_id": f"chaos-{process}",
            "batch_id": counter,
            "job": f"{process}-{counter}",
            "files": self.config.files_per_commit,
        }

    def execute(self, ctx: ClientContext, f: str, value: Any) -> Completion:
        lh = ctx.lakehouse
        if f == "read":
            try:
                version = lh.version(TABLE)
                files = lh.files(TABLE, version=version)
            except Exception as exc:
                return Completion("fail", value, error=describe(exc))
            location = os.path.join(lh.warehouse, TABLE)
            paths = [os.path.relpath(d.path, location) for d in files]
            # A digest, not the list: thousands of paths per read would bloat the history.
            return Completion(
                "ok",
                {
                    "version": version,
                    "files": len(paths),
                    "digest": digest(paths),
                    "partial_jobs": partial_jobs(paths),
                },
            )
        data_file = _spark_integration().DataFile
        location = os.path.join(lh.warehouse, TABLE)
        k = value["files"]
        data = [
            data_file(
                os.path.join(location, f"{_JOB_PREFIX}{value['job']}", f"part-{i}-of-{k}.parquet"),
                size_bytes=1000 + i,
                record_count=self.config.rows_per_file,
            )
            for i in range(k)
        ]
        if ctx.phase is not None:
            ctx.phase.set(ctx.phase.COMMITTING)
        try:
            version = lh.append_files(
                TABLE, data, app_id=value["app_id"], batch_id=value["batch_id"]
            )
        except TransactionAbortedError as exc:
            self._replay = None
            return Completion("fail", value, error=describe(exc))
        except Exception as exc:
            self._replay = {k: v for k, v in value.items() if k != "replay"}
            return Completion("info", value, error=describe(exc))
        finally:
            if ctx.phase is not None:
                ctx.phase.set(ctx.phase.IDLE)
        self._replay = None
        return Completion("ok", {**value, "version": version})

    # --- harness side --------------------------------------------------------------

    def setup(self, manager: Manager, warehouse: str) -> None:
        types = importlib.import_module("pyspark.sql.types")
        lh = self.open_lakehouse(manager, warehouse, 60.0)
        lh.create_table(TABLE, types.StructType([types.StructField("id", types.LongType())]))

    def final_read(
        self, manager: Manager, ops: list[dict[str, Any]], warehouse: str
    ) -> list[dict[str, Any]]:
        lh = self.open_lakehouse(manager, warehouse, 60.0)
        location = os.path.join(warehouse, TABLE)
        # The catalog's history, not Lakehouse.history: it names the transaction of each
        # version. Commits through a gateway's service record no commit timestamp (the
        # gateway looks it up in the transactions table), so look them up here too.
        catalog = importlib.import_module("spark_integration._catalog").Catalog(
            manager,
            "chaos",
            commit_ts_of=manager.outcome_of if isinstance(manager, TransactionManager) else None,
        )
        commits = [
            {
                "version": h.record.version,
                "commit_ts": h.commit_ts,
                "txn_start_ts": h.record.txn_start_ts,
                "operation": h.record.operation,
                "app_id": h.record.app_id,
                "batch_id": h.record.batch_id,
                "added": sorted(e.path for e in h.added),
                "removed": len(h.removed),
            }
            for h in catalog.history(TABLE)
        ]
        latest = sorted(os.path.relpath(d.path, location) for d in lh.files(TABLE))
        invoke = {"type": "invoke", "process": FINAL_PROCESS, "f": "history", "value": None}
        return [invoke, {**invoke, "type": "ok", "value": {"commits": commits, "files": latest}}]

    def check(self, ops: list[dict[str, Any]]) -> list[CheckResult]:
        final = next(
            (op for op in ops if op["process"] == FINAL_PROCESS and op["type"] == "ok"), None
        )
        shape = CheckResult("lakehouse versions")
        acked = CheckResult("lakehouse acknowledged commits")
        reads = CheckResult("lakehouse reads")
        if final is None:
            shape.anomalies.append({"check": shape.name, "type": "no-final-read"})
            return [shape]
        commits: list[dict[str, Any]] = final["value"]["commits"]
        cumulative = self._check_versions(shape, commits, final["value"]["files"])
        self._check_acknowledged(acked, ops, commits)
        self._check_reads(reads, ops, cumulative)
        return [shape, acked, reads]

    def _check_versions(
        self, result: CheckResult, commits: list[dict[str, Any]], latest: list[str]
    ) -> list[tuple[int, int]]:
        """Dense versions of whole, unique commits; returns each version's file count
        and :func:`digest`."""
        flag = _flagger(result)
        seen_jobs: dict[str, int] = {}
        seen_batches: dict[tuple[str, Any], int] = {}
        cumulative: list[tuple[int, int]] = []
        files: set[str] = set()
        fingerprint = 0
        previous: tuple[int, Any] | None = None  # commit_ts and transaction of the last
        #: The transaction of the version just before (stamped with its commit_ts or not:
        #: a version whose log record carries no commit_ts still sits between others).
        previous_txn: Any = None
        transactions: set[Any] = set()
        for expected, c in enumerate(commits):
            if c["version"] != expected:
                flag("version-gap", f"version {c['version']} where {expected} was expected")
            txn = c.get("txn_start_ts")
            if txn is not None and txn in transactions and previous_txn != txn:
                flag(
                    "group-not-consecutive",
                    f"version {c['version']} was committed by transaction {txn}, as an "
                    "earlier version was, with another transaction's version in between",
                )
            transactions.add(txn)
            previous_txn = txn
            # Each version commits on top of the one before it: the oracle must agree.
            # A group commit writes consecutive versions in one transaction: one stamp.
            if c["commit_ts"] is not None:
                if previous is not None:
                    ts, previous_txn = previous
                    same = txn is not None and txn == previous_txn
                    if (same and c["commit_ts"] != ts) or (not same and c["commit_ts"] <= ts):
                        flag(
                            "version-order",
                            f"version {c['version']} has commit_ts {c['commit_ts']}, not "
                            f"{'equal to' if same else 'above'} {ts} of the version before "
                            f"it ({'the same' if same else 'another'} transaction)",
                        )
                previous = (c["commit_ts"], txn)
            if c["removed"]:
                flag("unexpected-removal", f"version {c['version']} removed files")
            jobs: dict[str, set[int]] = {}
            parts: dict[str, int] = {}
            for path in c["added"]:
                job, part, count = _job_of(path)
                jobs.setdefault(job, set()).add(part)
                parts[job] = count
            for job, got in jobs.items():
                if got != set(range(parts[job])):
                    flag(
                        "partial-commit",
                        f"version {c['version']} holds parts {sorted(got)} of job {job}, "
                        f"which has {parts[job]}",
                    )
                if job in seen_jobs:
                    flag(
                        "duplicate-commit",
                        f"job {job} added by versions {seen_jobs[job]} and {c['version']}",
                    )
                seen_jobs[job] = c["version"]
            if c["app_id"] is not None:
                batch = (c["app_id"], c["batch_id"])
                if batch in seen_batches:
                    flag(
                        "duplicate-batch",
                        f"batch {batch} committed by versions {seen_batches[batch]} and "
                        f"{c['version']}",
                    )
                seen_batches[batch] = c["version"]
            new = [p for p in c["added"] if p not in files]
            files.update(new)
            fingerprint = digest(new, fingerprint)
            cumulative.append((len(files), fingerprint))
        if set(latest) != files:
            flag("files-mismatch", "the latest files are not the union of every version's")
        grouped = Counter(c.get("txn_start_ts") for c in commits)
        result.stats.update(
            versions=len(commits),
            files=len(files),
            jobs=len(seen_jobs),
            grouped_versions=sum(n for n in grouped.values() if n > 1),
        )
        return cumulative

    def _check_acknowledged(
        self, result: CheckResult, ops: list[dict[str, Any]], commits: list[dict[str, Any]]
    ) -> None:
        flag = _flagger(result)
        by_batch = {(c["app_id"], c["batch_id"]): c for c in commits if c["app_id"] is not None}
        outcomes: dict[tuple[str, Any], set[str]] = {}
        for op in ops:
            if op["f"] != "append" or op["type"] == "invoke":
                continue
            batch = (op["value"]["app_id"], op["value"]["batch_id"])
            outcomes.setdefault(batch, set()).add(op["type"])
            if op["type"] != "ok":
                continue
            commit = by_batch.get(batch)
            if commit is None:
                flag("lost-acknowledged-commit", f"batch {batch} acknowledged, not in history")
            elif commit["version"] != op["value"]["version"]:
                flag(
                    "wrong-version",
                    f"batch {batch} was told version {op['value']['version']}, history has "
                    f"it at {commit['version']}",
                )
        for batch, kinds in outcomes.items():
            if kinds == {"fail"} and batch in by_batch:
                flag("failed-commit-visible", f"batch {batch} only failed, yet it is committed")
        result.stats.update(
            batches=len(outcomes),
            acknowledged=sum(1 for k in outcomes.values() if "ok" in k),
            unknown=sum(1 for k in outcomes.values() if k == {"info"}),
        )

    def _check_reads(
        self, result: CheckResult, ops: list[dict[str, Any]], cumulative: list[tuple[int, int]]
    ) -> None:
        flag = _flagger(result)
        newest_acked = -1  # newest version acknowledged to any client so far
        pending: dict[int, int] = {}  # process -> newest_acked when its read was invoked
        checked = 0
        for op in ops:
            if op["process"] == FINAL_PROCESS:
                continue
            if op["type"] == "invoke":
                pending[op["process"]] = newest_acked
                continue
            floor = pending.pop(op["process"], -1)
            if op["f"] == "append" and op["type"] == "ok":
                newest_acked = max(newest_acked, op["value"]["version"])
            if op["f"] != "read" or op["type"] != "ok":
                continue
            checked += 1
            version, seen = op["value"]["version"], op["value"]
            if seen["partial_jobs"]:
                flag(
                    "read-not-whole",
                    f"process {op['process']} read part of jobs {seen['partial_jobs'][:5]} at "
                    f"version {version}",
                )
            if version < floor:
                flag(
                    "stale-read",
                    f"process {op['process']} read version {version} after version {floor} "
                    "was acknowledged",
                )
            if version >= len(cumulative):
                flag("read-of-unknown-version", f"read version {version}")
            elif (seen["files"], seen["digest"]) != cumulative[version]:
                flag(
                    "read-not-version",
                    f"process {op['process']} read {seen['files']} files at version {version}, "
                    f"not the {cumulative[version][0]} files that version holds",
                )
        result.stats["checked_reads"] = checked


class ServiceLakehouses:
    """A lakehouse on each gateway's ``LakehouseService``, used one at a time.

    A failed call moves the client to the next gateway, as a Spark driver with several
    gateway addresses would; a commit's own resends (same job id, until its deadline)
    stay on the gateway it was sent to, which is where its reply is.
    """

    def __init__(self, houses: list[Any]) -> None:
        self._houses = houses
        self._current = 0

    @property
    def warehouse(self) -> str:
        warehouse: str = self._houses[0].warehouse
        return warehouse

    def _on_current(self, method: str, *args: Any, **kwargs: Any) -> Any:
        house = self._houses[self._current]
        try:
            return getattr(house, method)(*args, **kwargs)
        except TransactionAbortedError:
            raise  # a definite answer: the gateway works
        except Exception:
            self._current = (self._current + 1) % len(self._houses)
            raise

    def version(self, name: str) -> int:
        version: int = self._on_current("version", name)
        return version

    def files(self, name: str, version: int | None = None) -> list[Any]:
        files: list[Any] = self._on_current("files", name, version=version)
        return files

    def append_files(self, name: str, files: list[Any], **kwargs: Any) -> int:
        version: int = self._on_current("append_files", name, files, **kwargs)
        return version


def _spark_integration() -> Any:
    """``spark_integration``, imported on first use: it needs the ``spark`` extra."""
    return importlib.import_module("spark_integration")


def _flagger(result: CheckResult) -> Callable[[str, str], None]:
    def flag(kind: str, explanation: str) -> None:
        result.anomalies.append({"check": result.name, "type": kind, "explanation": explanation})

    return flag
