"""The lakehouse workload's rewrites: row deletes and compactions, and the row checks.

Every row of the table has an id unique in the run: an appended file's ids follow
from its path (job, part) and row count (:func:`row_ids`), so appends write no file
on a local warehouse and the checker knows their rows without reading them. A
rewrite (op ``delete`` or ``compact``) reads one or more whole jobs of the latest
version (an appended job's rows from its name, a rewritten one's from its Parquet
file), writes what it keeps to one new Parquet file, ``_lh_job=<d|c><process>-
<counter>/part-0-of-1.parquet``, and commits it with ``Lakehouse.rewrite_files``,
which removes the jobs' files: as ``DELETE`` (one job, one to three rows fewer, with
the predicate ``id IN (...)``, which the appended files' statistics rule out for
every other job) or as ``OPTIMIZE`` (two or three jobs, every row kept). Rewrites
pick among the table's :data:`REWRITE_POOL` oldest jobs, so clients race for the same
files and some lose with ``ConcurrentModificationError``; a lost rewrite removes its
file, since nothing can name it.

The checks (:func:`check_rewrites`), on the final history (from the oldest retained
version, whose files are the base):

* a rewrite's version removed exactly the files the rewrite read and added only its
  own file, and the rewrite was acknowledged at that version if it was acknowledged;
* a rewrite that only failed is in no version and left no file behind;
* rows: the rows of every version (from the files it names: appended ones by name,
  rewritten ones read back by the final read) equal the model's, which adds an
  append's rows, takes a delete's acknowledged rows away and leaves a compaction's
  version as the one before it; the base holds no row twice;
* the latest version holds every row of every acknowledged or committed append unless
  a delete that did not fail took it, and no row an acknowledged delete took.
"""

from __future__ import annotations

import importlib
import io
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from percolake.tools.chaos._ops import Completion, describe
from percolake.tools.chaos._workload import CheckResult
from txn.errors import TransactionAbortedError

JOB_PREFIX = "_lh_job="
#: Shares of the operations that rewrite files (taken from the appends' share).
DELETE_SHARE = 0.02
COMPACT_SHARE = 0.02
#: Rewrites pick among the table's oldest jobs, this many: clients race for files.
REWRITE_POOL = 6
#: Op name -> the operation its version records, and its jobs' name prefix.
REWRITE_OPERATIONS = {"delete": "DELETE", "compact": "OPTIMIZE"}
_PREFIX = {"delete": "d", "compact": "c"}
#: Limits of the id layout (:func:`row_ids`).
MAX_FILES_PER_COMMIT = 1 << 8
MAX_ROWS_PER_FILE = 1 << 16


def job_of(path: str) -> tuple[str, int, int]:
    """``(job, part, parts)`` of ``.../_lh_job=<job>/part-<i>-of-<k>.parquet``."""
    folder, name = path.rsplit("/", 2)[-2:]
    job = folder.removeprefix(JOB_PREFIX)
    _, part, _, parts = name.removesuffix(".parquet").split("-")
    return job, int(part), int(parts)


def is_appended(job: str) -> bool:
    """Appends' jobs are ``<process>-<counter>``; rewrites' start with a letter."""
    return job[:1].isdigit()


def rewrite_job(f: str, process: int, counter: int) -> str:
    return f"{_PREFIX[f]}{process}-{counter}"


def output_of(job: str) -> str:
    """The one file a rewrite writes, relative to the table."""
    return f"{JOB_PREFIX}{job}/part-0-of-1.parquet"


def row_ids(path: str, count: int) -> list[int]:
    """The ids of an appended file: process, counter, part and row in one int64, so
    no two rows of a run share an id and each file's ids are one range (its stats)."""
    job, part, _ = job_of(path)
    *rest, counter = (int(x) for x in job.split("-"))
    process = rest[0] if rest else 0
    base = ((process << 24 | counter) << 8 | part) << 16
    return list(range(base, base + count))


def parquet_of(ids: list[int]) -> bytes:
    """A Parquet file of one ``id`` column, the table's schema."""
    pa = importlib.import_module("pyarrow")
    pq = importlib.import_module("pyarrow.parquet")
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), sink)
    return sink.getvalue()


def read_ids(path: str) -> list[int]:
    """The ids in a Parquet file the workload wrote (through the file-system layer)."""
    pq = importlib.import_module("pyarrow.parquet")
    data = _filesystem().read_bytes(path)
    ids: list[int] = pq.read_table(io.BytesIO(data)).column("id").to_pylist()
    return ids


def id_stats(ids: list[int]) -> dict[str, Any]:
    """``DataFile.stats`` of a file of ``ids``: what lets a delete's predicate pass
    every other job's files by."""
    stats = importlib.import_module("spark_integration.engine.model").ColumnStats
    return {"id": stats(0, min(ids), max(ids))} if ids else {}


# --- client side -----------------------------------------------------------------------


def rewrite(lh: Any, table: str, f: str, value: dict[str, Any], phase: Any) -> Completion:
    """One ``delete`` or ``compact`` op (see the module docstring)."""
    rng = random.Random(value["seed"])
    location = os.path.join(lh.warehouse, table)
    out_rel = output_of(value["job"])
    out = os.path.join(location, out_rel)
    try:
        version = lh.version(table)
        jobs: dict[str, list[tuple[str, int]]] = {}
        for d in lh.files(table, version=version):
            rel = os.path.relpath(d.path, location)
            jobs.setdefault(job_of(rel)[0], []).append((rel, d.record_count))
        picked = _pick(f, rng, jobs)
        if not picked:
            return Completion("fail", value, error="nothing to rewrite: too few live jobs")
        removed = [p for job in picked for p, _ in jobs[job]]
        ids: list[int] = []
        for job in picked:
            for rel, count in jobs[job]:
                appended = is_appended(job)
                ids += row_ids(rel, count) if appended else read_ids(os.path.join(location, rel))
        deleted: list[int] = []
        if f == "delete":
            deleted = sorted(rng.sample(ids, rng.randint(1, min(3, len(ids) - 1))))
        gone = set(deleted)
        kept = [i for i in ids if i not in gone]
        payload = parquet_of(kept)
        _filesystem().write_bytes(out, payload)
    except Exception as exc:
        # No commit was attempted: nothing names it.
        left = {} if _remove(out) else {"left_file": True}
        return Completion("fail", {**value, **left}, error=describe(exc))
    detail = {**value, "read_version": version, "removed": removed, "deleted": deleted}
    data = importlib.import_module("spark_integration").DataFile(
        out, size_bytes=len(payload), record_count=len(kept), stats=id_stats(kept)
    )
    predicate = f"id IN ({', '.join(map(str, deleted))})" if deleted else None
    if phase is not None:
        phase.set(phase.COMMITTING)
    try:
        committed = lh.rewrite_files(
            table,
            version,
            [os.path.join(location, p) for p in removed],
            [data],
            operation=REWRITE_OPERATIONS[f],
            predicate=predicate,
        )
    except TransactionAbortedError as exc:
        # Definitely not committed (a conflict): nothing names it.
        left = {} if _remove(out) else {"left_file": True}
        return Completion("fail", {**detail, **left}, error=describe(exc))
    except Exception as exc:
        return Completion("info", detail, error=describe(exc))  # it may have committed
    finally:
        if phase is not None:
            phase.set(phase.IDLE)
    return Completion("ok", {**detail, "version": committed})


def _pick(f: str, rng: random.Random, jobs: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Jobs to rewrite among the oldest: one of at least two rows to delete from, or
    two or three to compact."""
    pool = list(jobs)[:REWRITE_POOL]
    if f == "delete":
        rows = [job for job in pool if sum(n for _, n in jobs[job]) >= 2]
        return [rng.choice(rows)] if rows else []
    if len(pool) < 2:
        return []
    return rng.sample(pool, rng.randint(2, min(3, len(pool))))


def _remove(path: str) -> bool:
    """Whether ``path`` is gone; best effort, as the store may be down (an s3 fault)."""
    try:
        _filesystem().delete_file(path)
    except Exception:
        return False
    return True


# --- harness side ----------------------------------------------------------------------


def stored_rewrites(location: str) -> tuple[set[str], list[str]]:
    """Every object under the table, and the rewrites' files among them (relative)."""
    stored = {f.path for f in _filesystem().list_files(location)}
    rewrites = [os.path.relpath(p, location) for p in stored if "/_lh_job=" in p]
    return stored, sorted(p for p in rewrites if not is_appended(job_of(p)[0]))


def rewrite_rows(location: str, paths: Iterable[str]) -> dict[str, list[int] | None]:
    """The ids in each rewrite file named by the final history (``None``: missing)."""
    out: dict[str, list[int] | None] = {}
    for rel in sorted(set(paths)):
        if is_appended(job_of(rel)[0]):
            continue
        try:
            out[rel] = read_ids(os.path.join(location, rel))
        except FileNotFoundError:
            out[rel] = None
    return out


def check_rewrites(
    result: CheckResult,
    ops: list[dict[str, Any]],
    final: dict[str, Any],
    rows_per_file: int,
) -> None:
    """The checks of the module docstring; counts of each rewrite op in the stats."""
    flag = _flagger(result)
    commits: list[dict[str, Any]] = final["commits"]
    base: list[str] = final.get("base") or []
    oldest = commits[0]["version"] if commits else 0
    contents: dict[str, list[int] | None] = final.get("rewrite_rows", {})
    # Rewrite ops: the outcomes of each job, and the details of the last one that has them.
    outcomes: dict[str, str] = {}
    details: dict[str, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    left: set[str] = set()
    for op in ops:
        if op["f"] not in REWRITE_OPERATIONS:
            continue
        job = op["value"]["job"]
        if op["type"] == "invoke":
            outcomes.setdefault(job, "info")  # a client killed in it never completes it
            continue
        outcomes[job] = op["type"]
        if op["value"].get("left_file"):
            left.add(job)  # its removal failed, and the op says so
        counts[f"{op['f']}_{op['type']}"] += 1
        if "removed" in op["value"]:
            details[job] = op["value"]
    versions = _rewrite_versions(flag, commits, outcomes, details)
    stored = set(final.get("stored_rewrites", []))
    in_base = {job_of(p)[0] for p in base}
    for job, kind in outcomes.items():
        if kind != "fail":
            continue
        if job in versions or job in in_base:
            flag("failed-rewrite-visible", f"rewrite {job} failed, yet a version holds its file")
        if output_of(job) in stored and job not in left:
            flag("failed-rewrite-left-file", f"rewrite {job} failed and left {output_of(job)}")

    def rows_of(path: str) -> list[int]:
        if is_appended(job_of(path)[0]):
            return row_ids(path, rows_per_file)
        ids = contents.get(path)
        if ids is None:
            flag("missing-rewrite-file", f"{path}, named by the history, cannot be read")
            return []
        return ids

    # May a row be gone? Only if a delete that did not fail claimed it.
    may_delete = {i for job, d in details.items() if outcomes[job] != "fail" for i in d["deleted"]}
    acked_deleted = {i for job, d in details.items() if outcomes[job] == "ok" for i in d["deleted"]}
    actual: Counter[int] = Counter(i for p in base for i in rows_of(p))
    twice = [i for i, n in actual.items() if n > 1]
    if twice:
        flag("duplicate-row", f"the base (version {oldest}) holds ids {twice[:3]} twice")
    told = {job: d["version"] for job, d in details.items() if outcomes[job] == "ok"}
    resurrected = [
        i
        for job, d in details.items()
        if told.get(job, oldest + 1) <= oldest
        for i in d["deleted"]
        if actual[i]
    ]
    if resurrected:
        flag(
            "deleted-row-visible",
            f"the base (version {oldest}) holds deleted ids {resurrected[:3]}",
        )
    # diff = actual rows - model rows, kept up to date version by version.
    diff: Counter[int] = Counter()
    checked = 0
    for c in commits:
        if c["version"] <= oldest:
            continue
        added = [i for p in c["added"] for i in rows_of(p)]
        removed = [i for p in c.get("removed_files", []) for i in rows_of(p)]
        diff.update(added)
        diff.subtract(removed)
        job = versions.get(c["version"])
        if c.get("operation", "WRITE") == "WRITE":
            diff.subtract(added)  # the model adds the same rows
        elif c.get("operation") == "DELETE" and job in details:
            diff.update(details[job]["deleted"])  # the model takes these away
        elif c.get("operation") == "DELETE":
            took = Counter(removed) - Counter(added)  # no claim recorded: what it did
            diff.update(took)
            may_delete.update(took)
        # OPTIMIZE: the model is unchanged
        wrong = {i: n for i, n in diff.items() if n}
        checked += 1
        if wrong:
            extra = sorted(i for i, n in wrong.items() if n > 0)[:3]
            lacking = sorted(i for i, n in wrong.items() if n < 0)[:3]
            flag(
                "rows-mismatch",
                f"version {c['version']} ({c.get('operation')}) holds ids {extra} the "
                f"model lacks and lacks ids {lacking} the model holds",
            )
        diff = Counter()  # compare the later versions from here on
        actual.update(added)
        actual.subtract(removed)
    latest = +actual
    appended = {p for p in base if is_appended(job_of(p)[0])} | {
        p for c in commits for p in c["added"] if is_appended(job_of(p)[0])
    }
    for op in ops:
        if op["f"] == "append" and op["type"] == "ok":
            k, job = op["value"]["files"], op["value"]["job"]
            appended.update(f"{JOB_PREFIX}{job}/part-{i}-of-{k}.parquet" for i in range(k))
    # A rewrite that left no record of what it read (its client was killed in it) and
    # is not in the retained history may have deleted rows of jobs gone before it.
    unrecorded = any(
        kind != "fail" and job not in details and job not in versions
        for job, kind in outcomes.items()
    )
    retained_jobs = in_base | {job_of(p)[0] for c in commits for p in c["added"]}
    lost = [
        i
        for p in sorted(appended)
        if not unrecorded or job_of(p)[0] in retained_jobs
        for i in row_ids(p, rows_per_file)
        if not latest[i] and i not in may_delete
    ]
    if lost:
        flag(
            "lost-acknowledged-row",
            f"ids {lost[:3]} of committed appends are gone, no delete took them",
        )
    back = sorted(i for i in acked_deleted if latest[i])
    if back:
        flag(
            "deleted-row-visible",
            f"ids {back[:3]}, taken by acknowledged deletes, are in the latest version",
        )
    result.stats.update(
        **{
            f"{f}_{t}": counts[f"{f}_{t}"]
            for f in REWRITE_OPERATIONS
            for t in ("ok", "fail", "info")
        },
        rewrite_versions=len(versions) // 2,
        unrecorded_rewrites=unrecorded,
        rows_deleted=len(acked_deleted),
        row_checked_versions=checked,
        latest_rows=sum(latest.values()),
    )


def _rewrite_versions(
    flag: Callable[[str, str], None],
    commits: list[dict[str, Any]],
    outcomes: dict[str, str],
    details: dict[str, dict[str, Any]],
) -> dict[Any, Any]:
    """Each rewrite version's job, and each rewrite job's version (one map, both ways),
    checking that the version is the rewrite's: its file alone added, exactly the files
    it read removed, at the version it was told."""
    found: dict[Any, Any] = {}
    for c in commits:
        if c.get("operation") not in REWRITE_OPERATIONS.values():
            continue
        jobs = {job_of(p)[0] for p in c["added"]}
        job = next(iter(jobs)) if len(jobs) == 1 else None
        if job is None or job not in outcomes or c["added"] != [output_of(job)]:
            flag(
                "unknown-rewrite",
                f"version {c['version']} ({c['operation']}) added {c['added'][:3]}",
            )
            continue
        found[job], found[c["version"]] = c["version"], job
        d = details.get(job)
        if d is None:
            continue  # outcome unknown and no detail recorded
        if REWRITE_OPERATIONS[_op_of(job)] != c["operation"]:
            flag("rewrite-mismatch", f"version {c['version']} of rewrite {job} is {c['operation']}")
        removed = c.get("removed_files", [])
        if sorted(removed) != sorted(d["removed"]):
            flag(
                "rewrite-mismatch",
                f"version {c['version']} of rewrite {job} removed {len(removed)} files, not the "
                f"{len(d['removed'])} it read at version {d['read_version']}: "
                f"{sorted(set(removed) ^ set(d['removed']))[:3]} differ",
            )
        if outcomes[job] == "ok" and d["version"] != c["version"]:
            flag(
                "wrong-version",
                f"rewrite {job} was told version {d['version']}, history has {c['version']}",
            )
    oldest = commits[0]["version"] if commits else 0
    for job, d in details.items():
        if outcomes[job] == "ok" and job not in found and d["version"] >= oldest:
            flag(
                "lost-acknowledged-rewrite",
                f"rewrite {job} acknowledged at version {d['version']}, not in history",
            )
    return found


def _op_of(job: str) -> str:
    return next(f for f, prefix in _PREFIX.items() if job.startswith(prefix))


def _filesystem() -> Any:
    return importlib.import_module("spark_integration.spark.filesystem")


def _flagger(result: CheckResult) -> Callable[[str, str], None]:
    def flag(kind: str, explanation: str) -> None:
        result.anomalies.append({"check": result.name, "type": kind, "explanation": explanation})

    return flag
