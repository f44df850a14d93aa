"""The lakehouse workload: concurrent appends, row deletes and compactions, and readers.

Clients commit through ``spark_integration.Lakehouse.append_files`` (no Spark: on a
local warehouse the file lists are made up, which is all the metadata layer sees; on an
``s3://`` one, ``--warehouse s3``, each file's object is put through the file-system
layer first, so the ``s3-pause`` and ``s3-kill`` faults land in writes) with an
``(app_id, batch_id)`` on every commit, and replay a batch whose outcome was unknown,
exactly as a restarted Spark job would. Readers take ``version`` then
``files(version)``. The checks:

* versions are dense, and each one adds whole commits: every file of a job, or none;
* no job and no ``(app_id, batch_id)`` appears in two versions (replays add nothing);
* every acknowledged append is in the final history at the version it was told, and a
  batch whose every attempt definitely failed is not;
* every read of version ``v`` saw exactly the files of versions ``0..v``, and no read
  saw an older version than one acknowledged before it began (no stale reads);
* on S3, every file the final versions name is an object in the bucket;
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
(``gateway_catalog=False``). ``Lakehouse`` has no metadata-only overwrite.

Rows and rewrites (``_lakehouse_rewrites``): every row has an id unique in the run,
an appended file's following from its name, and one operation in 25 of each kind
rewrites whole jobs of the latest version without Spark: a ``delete`` of one to three rows
of one job (a ``DELETE``) or a ``compact`` of two or three jobs into one file (an
``OPTIMIZE``), committed through ``Lakehouse.rewrite_files``. The checks above hold
with the files a rewrite removed taken out of its version (jobs stay whole, reads
compare with the files each version holds); the rewrites' own checks (a rewrite's
version removed exactly what it read, a lost one left nothing, every version's rows
equal the model's, no committed append's row is lost unless a delete took it) are
the ``lakehouse rewrites`` check.

With ``--lakehouse-log-retention-s S`` the table keeps its log for ``S`` seconds (marks
for the default 7 days, so a replay is never committed twice during a run) and clients
also run ``Lakehouse.expire`` now and then (op ``expire``), besides the expiry that
follows checkpoints; half the reads travel back up to :data:`MAX_READ_BACK` versions
from the latest, around the expiry bound. The final history then starts at the oldest
readable version ``R``; the final read also lists the files of ``R`` (the base), and the
checks above hold from there: versions ``R..latest`` are dense and whole, the latest
files are the base plus what later versions added, a job in the base is in no later
version, an acknowledged append below ``R`` has its files in the base, and no expired
version was acknowledged to two jobs. Each version adds one job (a rewrite's also
removes the jobs it read), so the acknowledgements rebuild the files of expired
versions up to the first one no client was told (and when every one was told, they
and ``R``'s own changes must make the base exactly): reads of
those versions and of ``R`` on are compared, the others counted as unchecked; a read
refused with ``VersionNotFoundError`` (its version expired) is a clean failure. Expiry
itself: ``R - 1`` was replaced (version ``R`` committed) at least ``S`` before the final
read, the history starts at or above every bound an ``expire`` op reported, and no read
returned a version below a bound reported before it began.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from percolake.tools.chaos import _lakehouse_rewrites as rewrites
from percolake.tools.chaos._lakehouse_rewrites import JOB_PREFIX as _JOB_PREFIX
from percolake.tools.chaos._lakehouse_rewrites import job_of as _job_of
from percolake.tools.chaos._ops import FINAL_PROCESS, Completion, describe
from percolake.tools.chaos._workload import CheckResult, ClientContext, Workload
from txn import Manager, TransactionManager
from txn.errors import TransactionAbortedError

TABLE = "events"
#: With a log retention set, this share of operations runs ``Lakehouse.expire`` (drawn
#: out of the reads' share, so runs without it keep their operations): about one a
#: second over six clients, enough to expire versions between the checkpoints' passes.
EXPIRE_SHARE = 0.06
#: With a log retention set, half the reads read this many versions back at most (the
#: latest minus 1..MAX_READ_BACK): some land just above the expiry bound, some below.
MAX_READ_BACK = 40
#: A read refused because its version expired (between ``version()`` and ``files()``,
#: or a read of an older version).
_EXPIRED_READ = "VersionNotFoundError"


_DIGEST_MOD = 1 << 64


def _path_hash(path: str) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big")


def digest(paths: Iterable[str], start: int = 0) -> int:
    """A fingerprint of a set of file paths: the sum of their hashes, so that the
    fingerprint of each version follows from the previous one plus what it added."""
    return (start + sum(_path_hash(p) for p in paths)) % _DIGEST_MOD


def undigest(paths: Iterable[str], start: int) -> int:
    """The fingerprint after ``paths`` left the set ``start`` is the fingerprint of."""
    return (start - sum(_path_hash(p) for p in paths)) % _DIGEST_MOD


def partial_jobs(paths: Iterable[str]) -> list[str]:
    """Jobs of which ``paths`` holds some files but not all."""
    parts: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for path in paths:
        job, part, count = _job_of(path)
        parts.setdefault(job, set()).add(part)
        counts[job] = count
    return sorted(job for job, got in parts.items() if got != set(range(counts[job])))


class FinalReadRaced(RuntimeError):
    """A version landed between the final read's history and its listings."""


class LakehouseAppends(Workload):
    name = "lakehouse"
    history_name = "lakehouse.jsonl"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replay: dict[str, Any] | None = None
        if (
            self.config.files_per_commit > rewrites.MAX_FILES_PER_COMMIT
            or self.config.rows_per_file > rewrites.MAX_ROWS_PER_FILE
        ):
            raise ValueError(
                f"the lakehouse workload's row ids allow at most "
                f"{rewrites.MAX_FILES_PER_COMMIT} files per commit and "
                f"{rewrites.MAX_ROWS_PER_FILE} rows per file"
            )

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
        draw = rng.random()
        if draw < 0.3:
            if self.config.lakehouse_log_retention_s is not None:
                if draw < EXPIRE_SHARE:
                    return "expire", None
                if rng.random() < 0.5:
                    # Time travel to a version near the expiry bound, or past it.
                    return "read", {"back": rng.randint(1, MAX_READ_BACK)}
            return "read", None
        if draw < 0.3 + rewrites.DELETE_SHARE + rewrites.COMPACT_SHARE:
            f = "delete" if draw < 0.3 + rewrites.DELETE_SHARE else "compact"
            job = rewrites.rewrite_job(f, process, counter)
            return f, {"job": job, "seed": rng.randrange(1 << 32)}
        return "append", {
            "app_id": f"chaos-{process}",
            "batch_id": counter,
            "job": f"{process}-{counter}",
            "files": self.config.files_per_commit,
        }

    def execute(self, ctx: ClientContext, f: str, value: Any) -> Completion:
        lh = ctx.lakehouse
        if f == "expire":
            return self._expire(ctx)
        if f in rewrites.REWRITE_OPERATIONS:
            return rewrites.rewrite(lh, TABLE, f, value, ctx.phase)
        if f == "read":
            back = 0 if value is None else value["back"]
            try:
                version = max(0, lh.version(TABLE) - back)
                files = lh.files(TABLE, version=version)
            except Exception as exc:
                return Completion("fail", value, error=describe(exc))
            location = os.path.join(lh.warehouse, TABLE)
            paths = [os.path.relpath(d.path, location) for d in files]
            # A digest, not the list: thousands of paths per read would bloat the history.
            seen = {
                "version": version,
                "files": len(paths),
                "digest": digest(paths),
                "partial_jobs": partial_jobs(paths),
            }
            return Completion("ok", seen if back == 0 else {**seen, "back": back})
        data_file = _spark_integration().DataFile
        location = os.path.join(lh.warehouse, TABLE)
        k = value["files"]
        paths = [
            os.path.join(location, f"{_JOB_PREFIX}{value['job']}", f"part-{i}-of-{k}.parquet")
            for i in range(k)
        ]
        # Each file's ids follow from its name; their range is its statistics, which
        # keep a delete of other rows from conflicting with this append.
        ids = [rewrites.row_ids(path, self.config.rows_per_file) for path in paths]
        if self.config.warehouse == "s3":
            # Each file's object is put before the commit names it, as a task would; a
            # replay puts them again (same keys, same bytes). A store that refuses a
            # put fails this attempt before anything is committed: a definite failure
            # of this attempt, though an earlier one of a replay may have committed.
            try:
                sizes = []
                for path, file_ids in zip(paths, ids, strict=True):
                    payload = rewrites.parquet_of(file_ids)
                    _filesystem().write_bytes(path, payload)
                    sizes.append(len(payload))
            except Exception as exc:
                return Completion("fail", value, error=describe(exc))
        else:
            sizes = [1000 + i for i in range(k)]  # metadata only: no file is written
        data = [
            data_file(
                path,
                size_bytes=size,
                record_count=self.config.rows_per_file,
                stats=rewrites.id_stats(file_ids),
            )
            for path, size, file_ids in zip(paths, sizes, ids, strict=True)
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

    def _expire(self, ctx: ClientContext) -> Completion:
        """One ``Lakehouse.expire``: idempotent (bounds only rise), so its outcome only
        matters for the bound it reports; marked as a commit so kills land inside it."""
        if ctx.phase is not None:
            ctx.phase.set(ctx.phase.COMMITTING)
        try:
            result = ctx.lakehouse.expire(TABLE)
        except TransactionAbortedError as exc:
            return Completion("fail", None, error=describe(exc))
        except Exception as exc:
            return Completion("info", None, error=describe(exc))
        finally:
            if ctx.phase is not None:
                ctx.phase.set(ctx.phase.IDLE)
        return Completion(
            "ok",
            {
                "readable_from": result.readable_from,
                "deleted": result.deleted,
                "log_cells": result.log_cells,
                "file_rows": result.file_rows,
                "checkpoints": result.checkpoints,
            },
        )

    # --- harness side --------------------------------------------------------------

    def setup(self, manager: Manager, warehouse: str) -> None:
        types = importlib.import_module("pyspark.sql.types")
        lh = self.open_lakehouse(manager, warehouse, 60.0)
        retention = None
        if self.config.lakehouse_log_retention_s is not None:
            # The mark retention stays the default (7 days): no replay's mark expires
            # during a run, so "no batch committed twice" stays exact.
            retention = _spark_integration().Retention(
                log_retention_s=self.config.lakehouse_log_retention_s
            )
        lh.create_table(
            TABLE,
            types.StructType([types.StructField("id", types.LongType())]),
            retention=retention,
        )

    def final_read(
        self, manager: Manager, ops: list[dict[str, Any]], warehouse: str
    ) -> list[dict[str, Any]]:
        lh = self.open_lakehouse(manager, warehouse, 60.0)
        location = os.path.join(warehouse, TABLE)
        # The catalog's history, not Lakehouse.history: it names the transaction of each
        # version. Commits through a gateway's service record no commit timestamp (the
        # gateway looks it up in the transactions table), so look them up here too.
        catalog = importlib.import_module("spark_integration.engine").Catalog(
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
                "removed_files": sorted(e.path for e in h.removed),
                "timestamp_ms": h.record.timestamp_ms,
            }
            for h in catalog.history(TABLE)
        ]
        # After the history: every expiry it reflects ran before this instant.
        read_ms = time.time_ns() // 1_000_000
        # History leaves expired versions out: it starts at the oldest readable one,
        # whose files are the base the later versions add to. Should that version expire
        # in between, files() raises and the harness runs the final read again.
        oldest = commits[0]["version"] if commits else 0
        base = sorted(os.path.relpath(d.path, location) for d in lh.files(TABLE, version=oldest))
        latest = sorted(os.path.relpath(d.path, location) for d in lh.files(TABLE))
        # The history and the listings are separate reads: a commit still in flight when
        # the clients stopped (a gateway finishing a call its client gave up on) can land
        # between them, and the listing would show a version the history lacks. Versions
        # only grow, so the head unchanged after the listing means nothing landed since
        # the history; else the harness reads again (a 3-node run flagged files-mismatch
        # for a DELETE whose commit landed during its final read).
        head = lh.version(TABLE)
        if commits and head != commits[-1]["version"]:
            raise FinalReadRaced(
                f"version {head} was committed during the final read, whose history ends "
                f"at version {commits[-1]['version']}: reading again"
            )
        invoke = {"type": "invoke", "process": FINAL_PROCESS, "f": "history", "value": None}
        value = {
            "commits": commits,
            "files": latest,
            "base": base,
            "read_ms": read_ms,
            "log_retention_s": lh.retention(TABLE).log_retention_s,
        }
        # One listing of the table's objects (through the layer; on S3 with the run's
        # MinIO in this process's AWS variables): far fewer requests than a HEAD per
        # named file. Rewrites' files are read back for the row checks.
        stored, value["stored_rewrites"] = rewrites.stored_rewrites(location)
        named_anywhere = set(base).union(*(c["added"] for c in commits))
        value["rewrite_rows"] = rewrites.rewrite_rows(location, named_anywhere)
        if self.config.warehouse == "s3":
            named = sorted(set(latest) | set(base))
            value["objects"] = {
                "named": len(named),
                "stored": len(stored),
                "missing": [p for p in named if f"{location}/{p}" not in stored],
            }
        return [invoke, {**invoke, "type": "ok", "value": value}]

    def check(self, ops: list[dict[str, Any]]) -> list[CheckResult]:
        final = next(
            (op for op in ops if op["process"] == FINAL_PROCESS and op["type"] == "ok"), None
        )
        shape = CheckResult("lakehouse versions")
        acked = CheckResult("lakehouse acknowledged commits")
        reads = CheckResult("lakehouse reads")
        expiry = CheckResult("lakehouse expiry")
        rows = CheckResult("lakehouse rewrites")
        if final is None:
            shape.anomalies.append({"check": shape.name, "type": "no-final-read"})
            return [shape]
        value = final["value"]
        commits: list[dict[str, Any]] = value["commits"]
        # Histories recorded before expiry was checked carry no base: they start at 0.
        retained = self._check_versions(shape, commits, value["files"], value.get("base"))
        self._check_acknowledged(acked, ops, commits, retained)
        self._check_reads(reads, ops, retained)
        self._check_expiry(expiry, ops, value, retained)
        rewrites.check_rewrites(rows, ops, value, self.config.rows_per_file)
        if "objects" not in value:
            return [shape, acked, reads, expiry, rows]
        return [shape, acked, reads, expiry, rows, self._check_objects(value["objects"])]

    @staticmethod
    def _check_objects(objects: dict[str, Any]) -> CheckResult:
        """On S3: every file the final versions name is an object in the bucket."""
        result = CheckResult("lakehouse objects")
        missing: list[str] = objects["missing"]
        if missing:
            _flagger(result)(
                "missing-object",
                f"{len(missing)} file(s) named by committed versions are not in the store: "
                f"{missing[:3]}",
            )
        result.stats.update(named=objects["named"], stored=objects["stored"], missing=len(missing))
        return result

    def _check_versions(
        self,
        result: CheckResult,
        commits: list[dict[str, Any]],
        latest: list[str],
        base: list[str] | None = None,
    ) -> Retained:
        """Dense versions of whole, unique commits from the oldest retained one (the
        first of ``commits``), whose files are ``base`` (``None``: the history must
        start at version 0); returns what the other checks need."""
        flag = _flagger(result)
        oldest = commits[0]["version"] if commits else 0
        retained = Retained(oldest=oldest, latest=commits[-1]["version"] if commits else -1)
        if not commits:
            flag("no-versions", "the history holds no version, not even the latest")
        if base is None:
            base = []
            if oldest != 0:
                flag("version-gap", f"the history starts at version {oldest}, not 0")
        seen_jobs: dict[str, int | str] = {}
        seen_batches: dict[tuple[str, Any], int] = {}
        files: set[str] = set(base)
        fingerprint = digest(files)
        # Jobs committed by versions that expired: their files are in the base only.
        first_added = {_job_of(p)[0] for p in commits[0]["added"]} if commits else set()
        for job in partial_jobs(base):
            flag("partial-commit", f"the base (version {oldest}) holds part of job {job}")
        for path in base:
            job = _job_of(path)[0]
            retained.base_jobs.add(job)
            retained.base_by_job.setdefault(job, []).append(path)
            if job not in first_added:
                seen_jobs[job] = f"an expired version (below {oldest})"
        previous: tuple[int, Any] | None = None  # commit_ts and transaction of the last
        #: The transaction of the version just before (stamped with its commit_ts or not:
        #: a version whose log record carries no commit_ts still sits between others).
        previous_txn: Any = None
        transactions: set[Any] = set()
        for expected, c in enumerate(commits, start=oldest):
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
                    # Not previous_txn: that is the version just before, which this
                    # check needs next time round, stamped or not.
                    ts, stamped_txn = previous
                    same = txn is not None and txn == stamped_txn
                    if (same and c["commit_ts"] != ts) or (not same and c["commit_ts"] <= ts):
                        flag(
                            "version-order",
                            f"version {c['version']} has commit_ts {c['commit_ts']}, not "
                            f"{'equal to' if same else 'above'} {ts} of the version before "
                            f"it ({'the same' if same else 'another'} transaction)",
                        )
                previous = (c["commit_ts"], txn)
            # Only a rewrite removes files, whole jobs of them, each live before it.
            removed: list[str] = c.get("removed_files", [])
            if c["removed"] and (
                c.get("operation") not in rewrites.REWRITE_OPERATIONS.values()
                or len(removed) != c["removed"]
            ):
                flag("unexpected-removal", f"version {c['version']} removed files")
            for job in partial_jobs(removed):
                flag("partial-rewrite", f"version {c['version']} removed part of job {job}")
            if c["version"] > oldest:  # the base is the oldest version's files: after it
                gone = [p for p in removed if p in files]
                if len(gone) != len(removed):
                    flag(
                        "removed-file-not-live",
                        f"version {c['version']} removed {sorted(set(removed) - files)[:3]}, "
                        "which the version before it did not hold",
                    )
                files.difference_update(gone)
                fingerprint = undigest(gone, fingerprint)
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
                        f"job {job} added by {_named(seen_jobs[job])} and version {c['version']}",
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
            if c["version"] == oldest and base:
                # The base is this version's files: what it added must be among them.
                missing = [p for p in c["added"] if p not in files]
                if missing:
                    flag(
                        "base-mismatch",
                        f"version {oldest} added {missing[:3]}, which its files lack",
                    )
            new = [p for p in c["added"] if p not in files]
            files.update(new)
            fingerprint = digest(new, fingerprint)
            retained.cumulative[c["version"]] = (len(files), fingerprint)
        if set(latest) != files:
            extra = sorted(set(latest) - files)[:3]
            lacking = sorted(files - set(latest))[:3]
            flag(
                "files-mismatch",
                f"the latest files are not the base (version {oldest}) plus every later "
                f"version's adds, less its removals: {extra} not added by any, {lacking} "
                "added, not removed, but missing",
            )
        grouped = Counter(c.get("txn_start_ts") for c in commits)
        result.stats.update(
            versions=len(commits),
            oldest_retained=oldest,
            latest_version=retained.latest,
            base_files=len(base),
            files=len(files),
            jobs=len(seen_jobs),
            grouped_versions=sum(n for n in grouped.values() if n > 1),
        )
        return retained

    def _check_acknowledged(
        self,
        result: CheckResult,
        ops: list[dict[str, Any]],
        commits: list[dict[str, Any]],
        retained: Retained,
    ) -> None:
        flag = _flagger(result)
        oldest, base_jobs = retained.oldest, retained.base_jobs
        by_batch = {(c["app_id"], c["batch_id"]): c for c in commits if c["app_id"] is not None}
        outcomes: dict[tuple[str, Any], set[str]] = {}
        job_of_batch: dict[tuple[str, Any], str] = {}
        acked_at: dict[tuple[str, Any], int] = {}
        #: Expired version -> the job acknowledged at it, the files it added and removed.
        expired: dict[int, tuple[str, list[str], list[str]]] = {}
        removable = _removable_jobs(ops, commits)

        def acknowledged_expired(told: int, job: str, added: list[str], removed: list[str]) -> None:
            if expired.setdefault(told, (job, added, removed))[0] != job:
                flag(
                    "version-acknowledged-twice",
                    f"version {told} acknowledged to jobs {expired[told][0]} and {job}",
                )

        for op in ops:
            if op["f"] in rewrites.REWRITE_OPERATIONS and op["type"] == "ok":
                # Retained rewrites are the rewrites check's; expired ones rebuild files.
                if op["value"]["version"] < oldest:
                    job = op["value"]["job"]
                    out = [rewrites.output_of(job)]
                    acknowledged_expired(op["value"]["version"], job, out, op["value"]["removed"])
                continue
            if op["f"] != "append" or op["type"] == "invoke":
                continue
            batch = (op["value"]["app_id"], op["value"]["batch_id"])
            outcomes.setdefault(batch, set()).add(op["type"])
            job_of_batch[batch] = op["value"]["job"]
            if op["type"] != "ok":
                continue
            commit = by_batch.get(batch)
            told = op["value"]["version"]
            if acked_at.setdefault(batch, told) != told:
                flag(
                    "duplicate-batch",
                    f"batch {batch} acknowledged at versions {acked_at[batch]} and {told}",
                )
            if told < oldest and commit is None:
                # Its version expired: its files must be in the oldest retained version's,
                # unless a rewrite that did not fail removed them.
                job, k = op["value"]["job"], op["value"]["files"]
                paths = retained.base_by_job.get(job) or [
                    f"{_JOB_PREFIX}{job}/part-{i}-of-{k}.parquet" for i in range(k)
                ]
                acknowledged_expired(told, job, paths, [])
                if job not in base_jobs and removable is not None and job not in removable:
                    flag(
                        "lost-acknowledged-commit",
                        f"batch {batch} acknowledged at version {told}, which expired, and "
                        f"its job {job} is not in version {oldest}'s files, nor did a "
                        "rewrite remove it",
                    )
            elif commit is None:
                flag("lost-acknowledged-commit", f"batch {batch} acknowledged, not in history")
            elif commit["version"] != told:
                flag(
                    "wrong-version",
                    f"batch {batch} was told version {told}, history has it at {commit['version']}",
                )
        for batch, kinds in outcomes.items():
            if kinds == {"fail"} and (batch in by_batch or job_of_batch[batch] in base_jobs):
                flag("failed-commit-visible", f"batch {batch} only failed, yet it is committed")
        reconstructed = self._reconstruct_expired(flag, commits, retained, expired)
        result.stats.update(
            batches=len(outcomes),
            acknowledged=sum(1 for k in outcomes.values() if "ok" in k),
            acknowledged_expired=len(expired),
            reconstructed_versions=reconstructed,
            unknown=sum(1 for k in outcomes.values() if k == {"info"}),
        )

    @staticmethod
    def _reconstruct_expired(
        flag: Callable[[str, str], None],
        commits: list[dict[str, Any]],
        retained: Retained,
        expired: dict[int, tuple[str, list[str], list[str]]],
    ) -> int:
        """The files of expired versions, from the acknowledgements: each version adds
        one job, and a rewrite's removes the files it read. Version 0 is the workload's
        empty create. Fills ``retained.cumulative`` up to the first expired version no
        client was told; returns how many it filled. When every one was told, their
        files, changed as the oldest retained version changed them, must be the base
        exactly."""
        oldest = retained.oldest
        if oldest == 0 or not commits:
            return 0
        files: set[str] = set()
        fingerprint = 0
        retained.cumulative[0] = (0, 0)
        for version in range(1, oldest):
            if version not in expired:
                return version  # unknown: the chain stops here
            job, paths, removed = expired[version]
            if any(p not in files for p in removed):
                flag(
                    "base-mismatch",
                    f"version {version} was acknowledged to rewrite {job} of files that "
                    f"versions 1..{version - 1}, as acknowledged, do not hold",
                )
                return version
            files.difference_update(removed)
            fingerprint = undigest(removed, fingerprint)
            new = [p for p in paths if p not in files]
            files.update(new)
            fingerprint = digest(new, fingerprint)
            retained.cumulative[version] = (len(files), fingerprint)
        expected = (files - set(commits[0].get("removed_files", []))) | set(commits[0]["added"])
        base = {p for paths in retained.base_by_job.values() for p in paths}
        if expected != base:
            flag(
                "base-mismatch",
                f"versions 1..{oldest - 1} were acknowledged to jobs whose files, with what "
                f"version {oldest} added, are not version {oldest}'s files: "
                f"{sorted(base - expected)[:3]} unaccounted for",
            )
        return oldest

    def _check_reads(
        self, result: CheckResult, ops: list[dict[str, Any]], retained: Retained
    ) -> None:
        flag = _flagger(result)
        newest_acked = -1  # newest version acknowledged to any client so far
        expired_below = 0  # highest bound an expire op reported so far
        #: process -> (newest_acked, expired_below) when its operation was invoked
        pending: dict[int, tuple[int, int]] = {}
        checked = unchecked = refused = 0
        for op in ops:
            if op["process"] == FINAL_PROCESS:
                continue
            if op["type"] == "invoke":
                pending[op["process"]] = (newest_acked, expired_below)
                continue
            floor, expired_floor = pending.pop(op["process"], (-1, 0))
            if op["type"] == "ok" and (
                op["f"] == "append" or op["f"] in rewrites.REWRITE_OPERATIONS
            ):
                newest_acked = max(newest_acked, op["value"]["version"])
            if op["f"] == "expire" and op["type"] == "ok":
                expired_below = max(expired_below, op["value"]["readable_from"])
            if (
                op["f"] == "read"
                and op["type"] == "fail"
                and _EXPIRED_READ in (op.get("error") or "")
            ):
                refused += 1
            if op["f"] != "read" or op["type"] != "ok":
                continue
            version, seen = op["value"]["version"], op["value"]
            if seen["partial_jobs"]:
                flag(
                    "read-not-whole",
                    f"process {op['process']} read part of jobs {seen['partial_jobs'][:5]} at "
                    f"version {version}",
                )
            # A read back (time travel) read the latest version, then this many before.
            back = seen.get("back", 0)
            latest_seen = version + back
            if latest_seen < floor and (version > 0 or back == 0):
                flag(
                    "stale-read",
                    f"process {op['process']} read version {latest_seen} as the latest after "
                    f"version {floor} was acknowledged",
                )
            if version < expired_floor:
                flag(
                    "read-of-expired-version",
                    f"process {op['process']} read version {version} after an expiry "
                    f"reported versions below {expired_floor} expired",
                )
            if version > retained.latest:
                flag("read-of-unknown-version", f"read version {version}")
            elif version not in retained.cumulative:
                unchecked += 1  # expired by the final read: nothing left to compare with
            else:
                checked += 1
                want = retained.cumulative[version]
                if (seen["files"], seen["digest"]) != want:
                    flag(
                        "read-not-version",
                        f"process {op['process']} read {seen['files']} files at version "
                        f"{version}, not the {want[0]} files that version holds",
                    )
        result.stats.update(checked_reads=checked, unchecked_reads=unchecked, expired_reads=refused)

    def _check_expiry(
        self,
        result: CheckResult,
        ops: list[dict[str, Any]],
        final: dict[str, Any],
        retained: Retained,
    ) -> None:
        """Expiry removed only what the retention let go, and it ran when asked to."""
        flag = _flagger(result)
        retention_s = final.get("log_retention_s")
        wanted = self.config.lakehouse_log_retention_s
        if wanted is not None and retention_s != wanted:
            flag(
                "retention-mismatch",
                f"the table's log retention is {retention_s} s, the run asked for {wanted} s",
            )
        oldest = retained.oldest
        commits: list[dict[str, Any]] = final["commits"]
        read_ms = final.get("read_ms")
        if oldest > 0 and commits and retention_s is not None and read_ms is not None:
            # Version oldest - 1 expired: version `oldest`, which replaced it, committed
            # more than the retention before some expiry, itself before the final read.
            replaced_ms = commits[0].get("timestamp_ms")
            if replaced_ms is None or replaced_ms >= read_ms - int(retention_s * 1000):
                flag(
                    "premature-expiry",
                    f"version {oldest - 1} expired, yet version {oldest} replaced it at "
                    f"{replaced_ms} ms, less than the log retention ({retention_s:g} s) before "
                    f"the final read at {read_ms} ms",
                )
        expires = [op for op in ops if op["f"] == "expire" and op["type"] == "ok"]
        highest = max((op["value"]["readable_from"] for op in expires), default=0)
        if highest > oldest:
            flag(
                "expired-version-in-history",
                f"an expiry reported versions below {highest} expired, yet the final history "
                f"starts at {oldest}",
            )
        raising = 0  # expire ops that reported a higher bound than any before them
        bound = 0
        for op in expires:
            if op["value"]["readable_from"] > bound:
                raising += 1
                bound = op["value"]["readable_from"]
        result.stats.update(
            log_retention_s=retention_s,
            oldest_retained=oldest,
            expire_ops=len(expires),
            expire_ops_raising=raising,
            expire_ops_deleting=sum(1 for op in expires if op["value"]["deleted"] > 0),
            deleted_cells=sum(op["value"]["deleted"] for op in expires),
            highest_reported_bound=highest,
        )


@dataclass(slots=True)
class Retained:
    """What the final history keeps, for the checks after the version check."""

    #: The oldest readable version (0 unless versions expired) and the latest.
    oldest: int
    latest: int
    #: Version -> (file count, :func:`digest`) of its files, for every retained version.
    cumulative: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Jobs whose files the oldest retained version holds, and those files.
    base_jobs: set[str] = field(default_factory=set)
    base_by_job: dict[str, list[str]] = field(default_factory=dict)


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

    def expire(self, name: str) -> Any:
        return self._on_current("expire", name)

    def rewrite_files(self, name: str, *args: Any, **kwargs: Any) -> int:
        version: int = self._on_current("rewrite_files", name, *args, **kwargs)
        return version


def _removable_jobs(ops: list[dict[str, Any]], commits: list[dict[str, Any]]) -> set[str] | None:
    """Jobs whose files a rewrite that did not fail may have removed: those it said it
    read, and those the retained history removed; ``None`` (any job) when a rewrite
    that left no record of what it read (its client was killed in it) is not in the
    retained history, so it may have removed any job in an expired version."""
    outcome: dict[str, str] = {}
    read: dict[str, list[str]] = {}
    for op in ops:
        if op["f"] not in rewrites.REWRITE_OPERATIONS:
            continue
        job = op["value"]["job"]
        if op["type"] == "invoke":
            outcome.setdefault(job, "info")
            continue
        outcome[job] = op["type"]
        if "removed" in op["value"]:
            read[job] = op["value"]["removed"]
    in_history = {_job_of(p)[0] for c in commits for p in c["added"]}
    jobs = {_job_of(p)[0] for c in commits for p in c.get("removed_files", [])}
    for job, kind in outcome.items():
        if kind == "fail":
            continue
        if job in read:
            jobs.update(_job_of(p)[0] for p in read[job])
        elif job not in in_history:
            return None
    return jobs


def _filesystem() -> Any:
    """The lakehouse's file-system layer (``spark_integration.spark.filesystem``)."""
    return importlib.import_module("spark_integration.spark.filesystem")


def _spark_integration() -> Any:
    """``spark_integration``, imported on first use: it needs the ``spark`` extra."""
    return importlib.import_module("spark_integration")


def _named(where: int | str) -> str:
    return f"version {where}" if isinstance(where, int) else where


def _flagger(result: CheckResult) -> Callable[[str, str], None]:
    def flag(kind: str, explanation: str) -> None:
        result.anomalies.append({"check": result.name, "type": kind, "explanation": explanation})

    return flag
