"""The metadata layer: table metadata in percolake transactions, no Spark involved.

Every change to a table is one percolake transaction that writes the table's
head cell (see ``model`` for the layout). Two changes of one table therefore
always conflict on the head (first committer wins), and the loser retries on
a fresh snapshot where it re-checks what it depends on:

* a blind append depends on nothing but the table existing, so it always
  retries until it wins;
* an overwrite depends on the version it replaced: if the head moved, it fails
  with :class:`ConcurrentModificationError` instead of dropping the new files;
* every job depends on vacuum not having removed its files: a job that started
  before the cutoff of a vacuum that committed first fails the same way;
* an ``(app_id, batch_id)`` mark is read and written in the same transaction,
  so a replay racing its original serialises behind it and finds its mark.

After the commit point nothing is undone: the follow-up work of a commit
(recording its commit timestamp, a checkpoint) runs in transactions of its own,
and their failures are logged, never raised, because the caller would take them
for a failed commit and delete or re-append the files of a version that stands.

This module holds the :class:`Catalog` (its retry loop, reads and commits), the
one entry point the rest of the package uses; checkpoints live in
``checkpoints`` and vacuum's plan and fence in ``vacuum_plan``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.checkpoints import checkpoint_due, list_gen, write_checkpoint
from spark_integration.engine.errors import (
    ConcurrentModificationError,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
)
from spark_integration.engine.model import (
    APPEND,
    CREATE,
    OVERWRITE,
    EntryFactory,
    FileEntry,
    Generation,
    Head,
    Layout,
    LogRecord,
    TableMeta,
)
from spark_integration.engine.retention import (
    STEP_ROWS,
    ExpireResult,
    Retention,
    describe_s,
    expire_step,
    publish_expiry,
    read_expiry,
    read_retention,
    write_retention,
)
from spark_integration.engine.vacuum_plan import VacuumPlan, fence_vacuum, plan_vacuum
from storage_adapters import Cell, KVStore
from txn import Manager, Transaction, TransactionManager, TransactionStatus
from txn._retry import RetriesExhaustedError, RetryPolicy, run_transaction

log = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E")

#: Backoff between attempts at the head: full jitter, doubling from the base up to
#: the cap. The cap stays small because a conflicting append only lost a race for
#: one cell; long sleeps would only leave the head idle.
RETRY_BASE_S = 0.002
RETRY_CAP_S = 0.05
#: Cells the expiry that follows a checkpoint deletes at most: a commit (embedded)
#: or the gateway's follow-up thread is not held up long by a table's first expiry
#: after years; what is left goes after the next checkpoint.
FOLLOW_UP_EXPIRE_ROWS = 10 * STEP_ROWS
#: Log records whose commit stamps history reads in one store call.
STAMP_LOOKUP_CELLS = 1_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _wall_clock_ms() -> int:
    """A catalog's default clock: ``now_ms`` looked up at each call (tests patch it)."""
    return now_ms()


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a job reads before it writes any file."""

    meta: TableMeta
    head: Head
    replayed_version: int | None  # the version its (app_id, batch_id) already committed


@dataclass(frozen=True, slots=True)
class Committed:
    version: int
    commit_ts: int | None
    replayed: bool  # the (app_id, batch_id) had committed before: nothing was added
    group_size: int = 1  # how many commits shared the transaction


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One job's commit: ``files`` as the table's next version."""

    operation: str  # APPEND or OVERWRITE
    files: tuple[FileEntry, ...]
    job_id: str  # unique per job: its idempotency key
    job_started_ms: int
    app_id: str | None = None
    batch_id: int | str | None = None
    base_version: int | None = None  # overwrites: the version replaced

    def size_bytes(self) -> int:
        """About what the request writes, to bound a group."""
        return 256 + sum(64 + len(f.path) for f in self.files)


#: What a request came to in a commit attempt (see ``_GroupAttempt``).
_NEW, _OWN, _REPLAY = "new", "own", "replay"


@dataclass(frozen=True, slots=True)
class _Staged:
    kind: str  # _NEW: written now; _OWN: its job_id committed before; _REPLAY: its mark did
    version: int
    job_id: str
    gen: int
    gen_start: int


class _GroupAttempt:
    """One attempt at committing requests as consecutive versions, in ``tx``.

    Pure per attempt (the retry loop runs it again on a fresh transaction): the
    head is read once and advanced in memory from request to request.
    """

    def __init__(self, catalog: Catalog, name: str, tx: Transaction) -> None:
        self.catalog = catalog
        self.layout = catalog.layout
        self.name = name
        self.tx = tx

    def _read_marks(self, requests: Sequence[CommitRequest]) -> dict[bytes, int]:
        """Every job and batch mark the requests could find, in one round trip."""
        rows: list[bytes] = []
        for r in requests:
            rows.append(Layout.job_mark_row(self.name, r.job_id))
            if r.app_id is not None and r.batch_id is not None:
                rows.append(Layout.mark_row(self.name, r.app_id, r.batch_id))
        found = self.tx.get_many(self.layout.marks, [(row, Layout.COL_MARK) for row in rows])
        return {row: int(raw) for (row, _), raw in found.items()}

    def run(self, requests: Sequence[CommitRequest]) -> list[_Staged | ConcurrentModificationError]:
        name, layout, tx = self.name, self.layout, self.tx
        head = start = self.catalog._read_head(tx, name)
        # Mark row -> version: those committed before, then those of this group.
        marks = self._read_marks(requests)
        out: list[_Staged | ConcurrentModificationError] = []
        for r in requests:
            job_row = Layout.job_mark_row(name, r.job_id)
            done = marks.get(job_row)
            if done is not None:
                out.append(_Staged(_OWN, done, r.job_id, head.gen, head.gen_start))
                continue
            mark_row = None
            if r.app_id is not None and r.batch_id is not None:
                mark_row = Layout.mark_row(name, r.app_id, r.batch_id)
                done = marks.get(mark_row)
                if done is not None:
                    out.append(_Staged(_REPLAY, done, r.job_id, head.gen, head.gen_start))
                    continue
            if r.base_version is not None and head.version != r.base_version:
                out.append(
                    ConcurrentModificationError(
                        f"{r.operation.lower()} of table {name!r} was based on version "
                        f"{r.base_version}, but version {head.version} committed meanwhile; "
                        "nothing was committed (retry the job on the new version)"
                    )
                )
                continue
            if r.job_started_ms < head.vacuum_cutoff_ms:
                out.append(
                    ConcurrentModificationError(
                        f"a vacuum of table {name!r} with cutoff {head.vacuum_cutoff_ms} ms "
                        f"ran while this job (started {r.job_started_ms} ms) was writing, and "
                        "may have removed its files; nothing was committed (retry the job)"
                    )
                )
                continue
            head = self._write(head, r, job_row, mark_row)
            marks[job_row] = head.version
            if mark_row is not None:
                marks[mark_row] = head.version
            out.append(_Staged(_NEW, head.version, r.job_id, head.gen, head.gen_start))
        if head is not start:
            tx.put(layout.head, Layout.name_row(name), Layout.COL_HEAD, head.encode())
        return out

    def _write(self, head: Head, r: CommitRequest, job_row: bytes, mark_row: bytes | None) -> Head:
        """Write ``r`` as the version after ``head``; returns the head after it."""
        name, layout, tx = self.name, self.layout, self.tx
        version = head.version + 1
        # The log time: never below the head's, which a time-travel answer raised
        # above the time it answered for (see ``Catalog.version_at``).
        ms = max(self.catalog.clock_ms(), head.last_ms)
        if r.operation == OVERWRITE:
            gen, gen_start = head.gen + 1, version
            tx.put(
                layout.gens,
                Layout.gen_row(name, gen),
                Layout.COL_GEN,
                Generation(gen, version, ms).encode(),
            )
        else:
            gen, gen_start = head.gen, head.gen_start
        for index, entry in enumerate(r.files):
            tx.put(
                layout.files,
                Layout.file_row(name, gen, version, index),
                Layout.COL_FILE,
                entry.encode(),
            )
        record = LogRecord(
            version,
            r.operation,
            ms,
            gen,
            len(r.files),
            r.job_id,
            r.app_id,
            r.batch_id,
            tx.start_ts,
        )
        tx.put(layout.log, Layout.log_row(name, version), Layout.COL_RECORD, record.encode())
        stamp = str(version).encode()
        tx.put(layout.marks, job_row, Layout.COL_MARK, stamp)
        if mark_row is not None:
            tx.put(layout.marks, mark_row, Layout.COL_MARK, stamp)
        return Head(version, gen, gen_start, ms, head.vacuum_cutoff_ms, head.min_readable_version)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    record: LogRecord
    commit_ts: int | None
    added: list[FileEntry]
    removed: list[FileEntry]


class Catalog:
    """Lakehouse metadata of one catalog, over one transaction manager. Thread-safe.

    ``failpoints`` (tests only) is shared with the :class:`Lakehouse` that owns the
    catalog; the catalog hits the points from ``fp.SETTLE_COMMIT`` on.
    ``follow_ups`` and ``commit_ts_of`` are for the gateway's catalog (see
    ``spark_integration.service.servicer``).
    """

    def __init__(
        self,
        tm: Manager,
        catalog: str,
        *,
        commit_timeout_s: float = 300.0,
        failpoints: fp.FailPoints | None = None,
        follow_ups: Callable[[Callable[[], None]], object] | None = None,
        commit_ts_of: Callable[[int], int | None] | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self._tm = tm
        #: This process's wall clock in ms (tests inject skewed ones): log times,
        #: creation times and the "not in the future" check of time travel.
        self.clock_ms: Callable[[], int] = clock_ms or _wall_clock_ms
        #: Runs a commit's follow-up work later (a gateway's background executor);
        #: ``None`` runs it before the commit returns.
        self._follow_ups = follow_ups
        #: The commit timestamp of the transaction that began at a start timestamp,
        #: where the manager can look it up (a gateway's embedded manager). A catalog
        #: that has it records no commit timestamps: history looks each one up by
        #: its log record's ``txn_start_ts``.
        self._commit_ts_of = commit_ts_of
        #: Where history finds commit timestamps that were not recorded: the
        #: transactions table, then, once garbage collection deleted the entry, the
        #: commit stamp of the log record's version (rule S9 stamps it first). Only a
        #: manager with the store in this process has them (embedded, or a gateway's).
        self._outcome_of: Callable[[int], int | None] | None = commit_ts_of
        self._stamps: KVStore | None = None
        if isinstance(tm, TransactionManager):
            self._stamps = tm.store
            if self._outcome_of is None:
                self._outcome_of = tm.outcome_of
        self.layout = Layout(catalog)
        self._commit_timeout_s = commit_timeout_s
        self.failpoints = fp.FailPoints() if failpoints is None else failpoints
        # Table metadata never changes once created, and tables are never dropped.
        self._meta: dict[str, TableMeta] = {}
        self._head_locks: dict[str, threading.Lock] = {}
        self._head_locks_guard = threading.Lock()

    # --- the retry loop ---------------------------------------------------------------

    @contextlib.contextmanager
    def _head_turn(self, name: str) -> Iterator[None]:
        """Commits of one table from this process take turns at its head.

        Only one of them could win a given version anyway; the others would each
        write, conflict, clean up and retry. Queueing here costs nothing in
        safety (other processes still race through the transaction protocol) and
        keeps eight threads of one process near one thread's throughput.
        """
        with self._head_locks_guard:
            lock = self._head_locks.setdefault(name, threading.Lock())
        if not lock.acquire(timeout=self._commit_timeout_s):
            raise ConcurrentModificationError(
                f"commit to table {name!r} waited {self._commit_timeout_s:.0f} s for its "
                "turn behind other commits of this process; nothing was committed"
            )
        try:
            yield
        finally:
            lock.release()

    def _transact(
        self,
        fn: Callable[[Transaction], T],
        *,
        what: str,
        job_id: str | None = None,
        settle_unknown: bool = False,
    ) -> tuple[T, int | None]:
        """Run ``fn(tx)`` and commit; retry on conflicts at the head until the deadline.

        ``fn`` raising (:class:`ConcurrentModificationError` included) aborts and
        propagates. With a ``job_id`` (or ``settle_unknown``), an unknown commit outcome
        (S6) is settled by asking the manager with ``settle=True``, which fences the
        attempt: "not committed" stays true, so retrying cannot land it twice
        (reading the data back could not promise that: a Commit still queued at a
        gateway could land after the read). Anything failing while settling leaves
        the outcome unknown: it is never reported as "not committed", which would
        let the caller delete files a committed version names.
        """
        policy = RetryPolicy(
            max_attempts=None,
            deadline_s=self._commit_timeout_s,
            base_s=RETRY_BASE_S,
            cap_s=RETRY_CAP_S,
            settle_unknown=settle_unknown or job_id is not None,
            give_up_on=(ConcurrentModificationError,),
        )

        def outcome(txn_id: str, *, settle: bool = False) -> TransactionStatus | None:
            if job_id is not None:
                self.failpoints.hit(fp.SETTLE_COMMIT, job_id)
            return self._tm.outcome(txn_id, settle=settle)

        try:
            return run_transaction(self._tm.begin, outcome, fn, policy, what=what)
        except RetriesExhaustedError as exc:
            # Only the head row is contended: other commits of this table kept
            # winning the race. Nothing of ours is visible.
            raise ConcurrentModificationError(
                f"{what}: lost the race for the table's head {exc.attempts} times in "
                f"{self._commit_timeout_s:.0f} s; nothing was committed"
            ) from exc

    # --- reads ------------------------------------------------------------------------

    def _read_head(self, tx: Transaction, name: str) -> Head:
        raw = tx.get(self.layout.head, Layout.name_row(name), Layout.COL_HEAD)
        if raw is None:
            raise TableNotFoundError(f"no table {name!r} in catalog {self.layout.catalog!r}")
        return Head.decode(raw)

    def _read_meta(self, tx: Transaction, name: str) -> TableMeta:
        cached = self._meta.get(name)
        if cached is not None:
            return cached
        raw = tx.get(self.layout.tables, Layout.name_row(name), Layout.COL_META)
        if raw is None:
            raise TableNotFoundError(f"no table {name!r} in catalog {self.layout.catalog!r}")
        meta = TableMeta.decode(raw)
        self._meta[name] = meta
        return meta

    def _read_mark(
        self, tx: Transaction, name: str, app_id: str, batch_id: int | str
    ) -> int | None:
        raw = tx.get(self.layout.marks, Layout.mark_row(name, app_id, batch_id), Layout.COL_MARK)
        return None if raw is None else int(raw)

    def _generations(self, tx: Transaction, name: str) -> list[Generation]:
        return [
            Generation.decode(value)
            for _, _, value in tx.scan(
                self.layout.gens, Layout.prefix(name), Layout.prefix_end(name)
            )
        ]

    def _scan_files(
        self, tx: Transaction, name: str, start: bytes, end: bytes
    ) -> Iterator[tuple[tuple[int, int, int], FileEntry]]:
        for row, _, value in tx.scan(self.layout.files, start, end):
            yield Layout.parse_file_row(name, row), FileEntry.decode(value)

    def meta(self, name: str) -> TableMeta:
        cached = self._meta.get(name)
        if cached is not None:
            return cached
        with self._tm.begin() as tx:
            return self._read_meta(tx, name)

    def prepare(
        self, name: str, app_id: str | None = None, batch_id: int | str | None = None
    ) -> Prepared:
        """Metadata, head and the batch's earlier version, at one snapshot."""
        with self._tm.begin() as tx:
            head = self._read_head(tx, name)
            meta = self._read_meta(tx, name)
            replayed = (
                self._read_mark(tx, name, app_id, batch_id)
                if app_id is not None and batch_id is not None
                else None
            )
        return Prepared(meta, head, replayed)

    def list_tables(self) -> list[str]:
        with self._tm.begin() as tx:
            return [
                row.decode()
                for row, column, _ in tx.scan(self.layout.tables)
                if column == Layout.COL_META  # a table's row has retention cells too
            ]

    def files(
        self, name: str, version: int | None, make: EntryFactory[E]
    ) -> tuple[TableMeta, int, list[E]]:
        """The table's metadata, the version read, and that version's files in commit order."""
        with self._tm.begin() as tx:
            head = self._read_head(tx, name)
            meta = self._read_meta(tx, name)
            if version is None:
                version = head.version
            self._check_readable(tx, name, head, version)
            gen = head.gen if version >= head.gen_start else self._gen_of(tx, name, version)
            return meta, version, list_gen(tx, self.layout, name, gen, version, make)

    def version_at(self, name: str, timestamp_ms: int) -> int:
        """The version that was the table's latest at ``timestamp_ms`` (time travel).

        The answer is repeatable: once given for a time, it is the answer for that
        time for ever (until the version expires or is vacuumed away). Log times
        never decrease from one version to the next, since every commit writes the
        head and takes its log time at or above the head's ``last_ms``; so a version
        committed after this answer can only take a log time at or below
        ``timestamp_ms`` if the head's ``last_ms`` still was at or below it. In that
        case the answer is the latest version, and before giving it this raises the
        head's ``last_ms`` above ``timestamp_ms`` in a transaction of its own: a
        commit that took its log time earlier conflicts with it on the head and
        retries above; one that comes later reads the raised head. Commits order
        themselves on the head, not on anyone's clock, so clocks skewed between
        gateways change log times, never an answer. Otherwise (some version's log
        time is above ``timestamp_ms``) a binary search over the log reads about
        log2(versions) records and writes nothing.

        Raises :class:`VersionNotFoundError` for a time before the table was created
        or after now by this process's clock.
        """
        if timestamp_ms > self.clock_ms():
            raise VersionNotFoundError(
                f"timestamp {timestamp_ms} ms is in the future: table {name!r} has no "
                "version as of then yet"
            )
        with self._tm.begin() as tx:
            head = self._read_head(tx, name)
            if timestamp_ms < head.last_ms:
                return self._search_log(tx, name, head, timestamp_ms)

        def fence(tx: Transaction) -> int:
            head = self._read_head(tx, name)
            if timestamp_ms < head.last_ms:  # a commit or another answer raised it
                return self._search_log(tx, name, head, timestamp_ms)
            raised = dataclasses.replace(head, last_ms=timestamp_ms + 1)
            tx.put(self.layout.head, Layout.name_row(name), Layout.COL_HEAD, raised.encode())
            return head.version

        # The answer is given only once the raised head committed; an attempt whose
        # outcome is unknown is settled (fenced) and the question asked again.
        with self._head_turn(name):
            version, _ = self._transact(
                fence,
                what=f"time travel to {timestamp_ms} ms in table {name!r}",
                settle_unknown=True,
            )
        return version

    def _search_log(self, tx: Transaction, name: str, head: Head, timestamp_ms: int) -> int:
        """The newest version whose log time is at or below ``timestamp_ms``, at ``tx``'s
        snapshot (log times never decrease from one version to the next)."""

        def at(version: int) -> int:
            raw = tx.get(self.layout.log, Layout.log_row(name, version), Layout.COL_RECORD)
            if raw is None:
                raise VersionNotFoundError(f"table {name!r} has no log record of {version}")
            return LogRecord.decode(raw).timestamp_ms

        # Below the oldest readable version log records may have expired.
        lo, hi = head.min_readable_version, head.version
        if at(lo) > timestamp_ms:
            if lo == 0:
                raise VersionNotFoundError(
                    f"table {name!r} was created after {timestamp_ms} ms: no version as of then"
                )
            self._check_readable(tx, name, head, lo - 1)  # raises: expired or vacuumed
        while lo < hi:  # at(lo) <= timestamp_ms; the answer is in [lo, hi]
            mid = (lo + hi + 1) // 2
            if at(mid) <= timestamp_ms:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _check_readable(self, tx: Transaction, name: str, head: Head, version: int) -> None:
        if version > head.version:
            raise VersionNotFoundError(
                f"table {name!r} has no version {version}; its latest is {head.version}"
            )
        if version < head.min_readable_version:
            if version < read_expiry(tx, self.layout, name).readable_from:
                retention = read_retention(tx, self.layout, name)
                raise VersionNotFoundError(
                    f"version {version} of table {name!r} expired: it was replaced more than "
                    f"the table's log retention ({describe_s(retention.log_retention_s)}) ago "
                    "and its log and file records were removed (versions from "
                    f"{head.min_readable_version} on are readable)"
                )
            raise VersionNotFoundError(
                f"version {version} of table {name!r} is no longer readable: vacuum removed "
                f"its files (versions from {head.min_readable_version} on are readable)"
            )

    def _gen_of(self, tx: Transaction, name: str, version: int) -> int:
        gen = 0
        for g in self._generations(tx, name):
            if g.start_version > version:
                break
            gen = g.gen
        return gen

    def history(self, name: str) -> list[HistoryEntry]:
        """Every version in order, with the files each one added and removed; expired
        versions (see ``retention``) are left out."""
        with self._tm.begin() as tx:
            self._read_head(tx, name)
            expired_below = read_expiry(tx, self.layout, name).readable_from
            records: dict[int, LogRecord] = {}
            commit_tss: dict[int, int] = {}
            for row, column, value in tx.scan(
                self.layout.log, Layout.prefix(name), Layout.prefix_end(name)
            ):
                version = Layout.version_of_log_row(name, row)
                if version < expired_below:
                    continue  # kept only while its marks are (they are found through it)
                if column == Layout.COL_RECORD:
                    records[version] = LogRecord.decode(value)
                elif column == Layout.COL_COMMIT_TS:
                    commit_tss[version] = int(value)
            by_version: dict[int, list[FileEntry]] = {}
            start, end = Layout.prefix(name), Layout.prefix_end(name)
            for (_, version, _), entry in self._scan_files(tx, name, start, end):
                by_version.setdefault(version, []).append(entry)
            # An overwrite removed the files of the generation it ended, as of the
            # version before it: from that generation's checkpoint, which expiry keeps.
            removed = {
                version: list_gen(tx, self.layout, name, record.gen - 1, version - 1, FileEntry)
                for version, record in records.items()
                if record.operation == OVERWRITE
            }
        self._find_commit_tss(name, records, commit_tss)
        return [
            HistoryEntry(
                record,
                commit_tss.get(version),
                by_version.get(version, []),
                removed.get(version, []),
            )
            for version, record in sorted(records.items())
        ]

    def _find_commit_tss(
        self, name: str, records: dict[int, LogRecord], commit_tss: dict[int, int]
    ) -> None:
        """Fill in the commit timestamps of ``records`` that none was recorded for.

        A gateway's catalog records none, and a follow-up that failed left one out.
        Every record was read at a snapshot, so its writer committed: its entry in
        the transactions table has the commit timestamp, and once garbage
        collection deleted the entry, the record's own version carries it as its
        commit stamp (S9 stamps every version before the entry goes). Hence this
        order: an entry missing now was deleted after the stamp was written. A
        catalog over a remote manager has neither; its history keeps ``None``.
        """
        missing = {v: r for v, r in records.items() if v not in commit_tss}
        if not missing or self._outcome_of is None:
            return
        looked_up: dict[int, int | None] = {}
        for version, record in missing.items():
            ts = record.txn_start_ts
            if ts not in looked_up:
                looked_up[ts] = self._outcome_of(ts)
            found = looked_up[ts]
            if found is not None and found >= 0:
                commit_tss[version] = found
        unstamped = sorted(v for v in missing if v not in commit_tss)
        if self._stamps is None:
            return
        for at in range(0, len(unstamped), STAMP_LOOKUP_CELLS):
            chunk = unstamped[at : at + STAMP_LOOKUP_CELLS]
            cells = {Cell(Layout.log_row(name, v), Layout.COL_RECORD): v for v in chunk}
            below = max(missing[v].txn_start_ts for v in chunk) + 1
            found_versions = self._stamps.get_versions(self.layout.log, list(cells), below_ts=below)
            for cell, versions in found_versions.items():
                version = cells[Cell(*cell)]
                for v in versions:
                    if v.ts == missing[version].txn_start_ts and v.commit_ts is not None:
                        commit_tss[version] = v.commit_ts

    # --- changes ----------------------------------------------------------------------

    def _record_commit_ts(self, name: str, versions: Sequence[int], commit_ts: int) -> None:
        """Record the commit timestamp, which the commit itself cannot know (history only).

        Follow-up work (see :meth:`_follow_up`): only history's commit_ts depends on
        it, and history finds it without the record where the catalog reaches the
        store (:meth:`_find_commit_tss`); a remote manager's catalog keeps ``None``
        for a version whose record failed.
        """
        with self._tm.begin() as tx:
            for version in versions:
                tx.put(
                    self.layout.log,
                    Layout.log_row(name, version),
                    Layout.COL_COMMIT_TS,
                    str(commit_ts).encode(),
                )

    def _follow_up(
        self, point: str, job_id: str, what: str, work: Callable[[], None] | None = None
    ) -> None:
        """Run follow-up work of a commit that already committed; log failures, never raise.

        The version stands whatever happens here. Reporting a failure would make the
        caller treat the commit as failed: delete files the version names, or retry
        and append them twice when it has no (app_id, batch_id). Only derived data
        depends on this work, and readers and later commits do without it. Hence
        ``Exception``, not ``TransactionError``: a store timeout, a fenced oracle or
        an unreachable gateway can come from any layer, typed or not.
        """
        try:
            self.failpoints.hit(point, job_id)
            if work is not None:
                work()
        except Exception as exc:
            log.warning("%s failed after the commit, which stands: %r", what, exc)

    def _after_commit(self, name: str, fresh: Sequence[_Staged], commit_ts: int | None) -> None:
        """The follow-up work of versions that one transaction committed; never raises.

        The commit timestamps of all of them are recorded in one transaction; a
        checkpoint is written at the newest version due one, per generation.
        """
        where = f"table {name!r} version {fresh[0].version}" + (
            f"-{fresh[-1].version}" if len(fresh) > 1 else ""
        )
        for staged in fresh:
            self._follow_up(fp.AFTER_COMMIT_POINT, staged.job_id, f"follow-up work of {where}")
        # Unknown when an unknown outcome was settled. Not recorded by a gateway's
        # catalog, one transaction less per commit: its history finds the timestamp
        # in the transactions table or, once that entry is collected, in the log
        # record's commit stamp (``_find_commit_tss``).
        if commit_ts is not None and self._commit_ts_of is None:
            self._follow_up(
                fp.BEFORE_RECORD_COMMIT_TS,
                fresh[0].job_id,
                f"recording the commit_ts of {where}",
                lambda: self._record_commit_ts(name, [s.version for s in fresh], commit_ts),
            )
        due: dict[int, _Staged] = {}
        for staged in fresh:
            if checkpoint_due(staged.version - staged.gen_start):
                due[staged.gen] = staged
        for staged in due.values():
            self._follow_up(
                fp.BEFORE_CHECKPOINT,
                staged.job_id,
                f"the checkpoint of table {name!r} version {staged.version}",
                lambda s=staged: write_checkpoint(  # type: ignore[misc]
                    self._tm, self.layout, name, s.gen, s.version
                ),
            )
        if due:
            # Retention's work comes with checkpoints, as Delta's log cleanup does: a
            # checkpoint is what lets old file rows go, and it comes every 100 or
            # 1,000 versions, so expiry's reads stay a small share of the commits'.
            newest = fresh[-1]
            self._follow_up(
                fp.BEFORE_EXPIRE,
                newest.job_id,
                f"expiry of table {name!r} after version {newest.version}",
                lambda: self._expire_quietly(name),
            )

    def _expire_quietly(self, name: str) -> None:
        result = self.expire(name, self.clock_ms(), max_rows=FOLLOW_UP_EXPIRE_ROWS)
        if result.deleted:
            log.info("expiry of %s: %s", name, result)

    def create(
        self, meta: TableMeta, job_id: str, retention: Retention | None = None
    ) -> int | None:
        """Create the table at version 0; returns the commit timestamp.

        ``retention``: the table's retention properties (``None``: the defaults),
        written in the same transaction.
        """
        name = meta.name

        def attempt(tx: Transaction) -> int:
            row = Layout.name_row(name)
            if tx.get(self.layout.tables, row, Layout.COL_META) is not None:
                raise TableExistsError(f"table {name!r} already exists")
            ms = self.clock_ms()
            tx.put(self.layout.tables, row, Layout.COL_META, meta.encode())
            tx.put(self.layout.head, row, Layout.COL_HEAD, Head(0, 0, 0, ms).encode())
            tx.put(self.layout.gens, Layout.gen_row(name, 0), Layout.COL_GEN, _gen0(ms))
            record = LogRecord(0, CREATE, ms, 0, 0, job_id, None, None, tx.start_ts)
            tx.put(self.layout.log, Layout.log_row(name, 0), Layout.COL_RECORD, record.encode())
            if retention is not None:
                write_retention(tx, self.layout, name, retention)
            return 0

        _, commit_ts = self._transact(
            attempt,
            what=f"create table {name!r}",
            job_id=job_id,
        )
        # The commit point is behind us: nothing below may raise.
        self._after_commit(name, [_Staged(_NEW, 0, job_id, 0, 0)], commit_ts)
        return commit_ts

    def commit_files(
        self,
        name: str,
        operation: str,
        files: Sequence[FileEntry],
        *,
        job_id: str,
        job_started_ms: int,
        app_id: str | None = None,
        batch_id: int | str | None = None,
        base_version: int | None = None,
    ) -> Committed:
        """Commit ``files`` as the next version, in one transaction.

        ``APPEND`` adds them; ``OVERWRITE`` makes them the only live files and
        requires the head to still be at ``base_version``.
        """
        request = CommitRequest(
            operation, tuple(files), job_id, job_started_ms, app_id, batch_id, base_version
        )
        with self._head_turn(name):
            (result,) = self.commit_group(name, [request])
        if isinstance(result, BaseException):
            raise result
        return result

    def commit_group(
        self, name: str, requests: Sequence[CommitRequest]
    ) -> list[Committed | ConcurrentModificationError]:
        """Commit every request as its own consecutive version, in one transaction.

        Each request gets its own log record, file rows and marks, exactly as if it
        had committed alone; the head is written once. A request whose own checks
        fail (a stale overwrite base, a vacuum that may have removed its files) gets
        its :class:`ConcurrentModificationError` in the returned list and writes
        nothing; the others still commit. A failure of the transaction itself (an
        unknown outcome, the head lost too often, an unreachable store) is raised
        and concerns every request alike. A request whose ``job_id`` already
        committed (it was sent again after a lost reply) gets that version back; one
        whose ``(app_id, batch_id)`` did gets it back as a replay.

        Follow-up work of the new versions runs on ``follow_ups`` when the catalog
        has one (after this returns), else before this returns; it never raises.
        """
        for request in requests:
            _check_request(request)
        if not requests:
            return []
        what = (
            f"{requests[0].operation.lower()} to table {name!r}"
            if len(requests) == 1
            else f"group commit of {len(requests)} appends to table {name!r}"
        )
        staged, commit_ts = self._transact(
            lambda tx: _GroupAttempt(self, name, tx).run(requests),
            what=what,
            job_id=requests[0].job_id,
        )
        out: list[Committed | ConcurrentModificationError] = []
        fresh: list[_Staged] = []
        for outcome in staged:
            if isinstance(outcome, ConcurrentModificationError):
                out.append(outcome)
            elif outcome.kind == _NEW:
                fresh.append(outcome)
                out.append(Committed(outcome.version, commit_ts, False, len(requests)))
            else:
                replayed = outcome.kind == _REPLAY
                out.append(Committed(outcome.version, None, replayed, len(requests)))
        if fresh:
            # The commit point is behind us: nothing below may raise.
            self._schedule_follow_ups(name, fresh, commit_ts)
        return out

    def _schedule_follow_ups(
        self, name: str, fresh: Sequence[_Staged], commit_ts: int | None
    ) -> None:
        """:meth:`_after_commit` now, or on ``follow_ups`` when the catalog has one."""
        if self._follow_ups is None:
            self._after_commit(name, fresh, commit_ts)
            return
        try:
            self._follow_ups(lambda: self._after_commit(name, fresh, commit_ts))
        except Exception as exc:  # a closed executor, say: the commit stands
            log.warning("follow-up work of table %r not queued: %r", name, exc)

    def commit_tables(self, commits: Sequence[tuple[str, CommitRequest]]) -> list[Committed]:
        """Commit files to several tables in one transaction: all of them, or none.

        Each ``(table, request)`` becomes that table's next version, exactly as
        :meth:`commit_files` would make it; a table appears at most once. A request
        failing its own checks fails the whole transaction (nothing of any table is
        committed) with its :class:`ConcurrentModificationError`. A request whose job
        or batch already committed gets that version back, as in :meth:`commit_group`.
        """
        names = [name for name, _ in commits]
        if len(set(names)) != len(names):
            raise ValueError(f"a multi-table commit names a table more than once: {names}")
        for _, request in commits:
            _check_request(request)
        if not commits:
            return []

        def attempt(tx: Transaction) -> list[_Staged]:
            out: list[_Staged] = []
            for name, request in commits:
                (staged,) = _GroupAttempt(self, name, tx).run([request])
                if isinstance(staged, ConcurrentModificationError):
                    raise staged
                out.append(staged)
            return out

        what = f"commit to tables {', '.join(repr(n) for n in names)}"
        with contextlib.ExitStack() as turns:
            for name in sorted(names):  # one order for every caller: no deadlock
                turns.enter_context(self._head_turn(name))
            staged, commit_ts = self._transact(attempt, what=what, job_id=commits[0][1].job_id)
        out: list[Committed] = []
        for (name, _), outcome in zip(commits, staged, strict=True):
            fresh = outcome.kind == _NEW
            out.append(
                Committed(outcome.version, commit_ts if fresh else None, outcome.kind == _REPLAY)
            )
            if fresh:
                self._schedule_follow_ups(name, [outcome], commit_ts)  # never raises
        return out

    # --- retention (the work is in _retention) ----------------------------------------

    def retention(self, name: str) -> Retention:
        """The table's retention properties (the defaults unless set)."""
        with self._tm.begin() as tx:
            self._read_head(tx, name)
            return read_retention(tx, self.layout, name)

    def set_retention(self, name: str, retention: Retention) -> None:
        """Change the table's retention properties; the next expiry applies them.

        No version is written (commits do not conflict with it). Lowering a
        retention expires more at the next expiry; raising it brings nothing back.
        """
        if not isinstance(retention, Retention):
            raise TypeError(f"retention must be a Retention, got {type(retention).__name__}")

        def attempt(tx: Transaction) -> None:
            self._read_head(tx, name)
            write_retention(tx, self.layout, name, retention)

        self._transact(attempt, what=f"setting the retention of table {name!r}")

    def expire(self, name: str, now_ms: int, *, max_rows: int | None = None) -> ExpireResult:
        """Expire what the table's retention no longer keeps, as of ``now_ms``.

        First publishes the new bounds (one transaction; it writes the head only when
        versions newly expire), then deletes in transactions of at most
        ``STEP_ROWS`` cells until nothing is left or about ``max_rows`` cells went
        (``None``: no limit; the rest goes next time). See ``retention``. Safe to
        run in several processes at once: every bound only rises, and two passes
        conflict on the table's expiry cell, so one of them retries.
        """

        def publish(tx: Transaction) -> int:
            head = self._read_head(tx, name)
            return publish_expiry(tx, self.layout, name, head, now_ms).readable_from

        readable, _ = self._transact(publish, what=f"expiry of table {name!r}")
        total = ExpireResult(readable_from=readable)
        while max_rows is None or total.deleted < max_rows:
            budget = STEP_ROWS if max_rows is None else min(STEP_ROWS, max_rows - total.deleted)
            step, _ = self._transact(
                lambda tx, b=budget: expire_step(tx, self.layout, name, b),  # type: ignore[misc]
                what=f"expiry of table {name!r}",
            )
            total.add(step.deleted)
            if not step.more:
                break
        return total

    # --- vacuum (the work is in _vacuum_plan) -----------------------------------------

    def vacuum_plan(self, name: str, cutoff_ms: int) -> VacuumPlan:
        """Which files the versions inside the retention can read, at one snapshot.

        See :func:`plan_vacuum`.
        """
        with self._tm.begin() as tx:
            head = self._read_head(tx, name)
            meta = self._read_meta(tx, name)
            gens = self._generations(tx, name)
            return plan_vacuum(tx, self.layout, name, meta, head, gens, cutoff_ms)

    def vacuum_fence(self, name: str, plan: VacuumPlan, cutoff_ms: int) -> set[str]:
        """Publish the cutoff in the head; returns files committed since the plan.

        Retried like a commit; see :func:`fence_vacuum`.
        """

        def attempt(tx: Transaction) -> set[str]:
            head = self._read_head(tx, name)
            return fence_vacuum(tx, self.layout, name, head, plan, cutoff_ms)

        since, _ = self._transact(attempt, what=f"vacuum of table {name!r}")
        return since


def _check_request(request: CommitRequest) -> None:
    if request.operation not in (APPEND, OVERWRITE):
        raise ValueError(f"unknown operation {request.operation!r}")
    if request.operation == OVERWRITE and request.base_version is None:
        raise ValueError("an overwrite needs the base_version it replaces")


def _gen0(ms: int) -> bytes:
    return Generation(0, 0, ms).encode()
