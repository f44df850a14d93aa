"""Commits: a job's files become the table's next version, in one transaction.

A commit reads the table's head, checks what it depends on, writes its version's
log record, file rows and marks, advances the head, and commits; the loser of a
race at the head retries on a fresh snapshot (``table_access``), where it re-checks:

* a blind append depends on nothing but the table existing, so it always
  retries until it wins;
* an overwrite depends on the version it replaced: if the head moved, it fails
  with :class:`ConcurrentModificationError` instead of dropping the new files;
* every job depends on vacuum not having removed its files: a job that started
  before the cutoff of a vacuum that committed first fails the same way;
* an ``(app_id, batch_id)`` mark is read and written in the same transaction,
  so a replay racing its original serialises behind it and finds its mark;
* a row-level statement (``DELETE``, ``UPDATE``, ``MERGE``, ``REPLACE WHERE``)
  depends on its read set: the files it rewrote or depends on must still be live
  and no file added since its snapshot may hold rows its predicate matches
  (``read_set.find_conflict``); it then commits a removal row per file it
  rewrote and a file row per file it wrote, or, once the generation's removals
  would outnumber its live files, a new generation of the live files at the head
  minus those it rewrote plus its own (``_row_level``);
* a compaction (``OPTIMIZE``) commits the same way, but changes no row: only a
  commit that removed one of the files it rewrote conflicts with it, never an
  append.

Once committed, the follow-up work of the new versions (``follow_ups``) runs and
never raises. The path of an append reads top-down: :class:`Commits` runs a
:class:`GroupAttempt` in a transaction (``table_access``), which writes cells laid
out by ``model``; then ``follow_ups`` records, checkpoints (``checkpoints``) and
expires (``expiry``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from spark_integration.engine import lifecycle
from spark_integration.engine.errors import ConcurrentModificationError, TableExistsError
from spark_integration.engine.follow_ups import FollowUps, NewVersion
from spark_integration.engine.model import (
    ADD_COLUMNS,
    APPEND,
    CREATE,
    DELETE,
    DML_OPERATIONS,
    MERGE,
    OPTIMIZE,
    OVERWRITE,
    UPDATE,
    FileEntry,
    Generation,
    Head,
    Layout,
    LogRecord,
    TableMeta,
)
from spark_integration.engine.read_set import ReadSet, check_read_set, find_conflict
from spark_integration.engine.retention import Retention, write_retention
from spark_integration.engine.table_access import TableAccess
from txn import Transaction


@dataclass(frozen=True, slots=True)
class Committed:
    version: int
    commit_ts: int | None
    replayed: bool  # the (app_id, batch_id) had committed before: nothing was added
    group_size: int = 1  # how many commits shared the transaction


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One job's commit: ``files`` as the table's next version."""

    operation: str  # APPEND, OVERWRITE, or one of DML_OPERATIONS
    files: tuple[FileEntry, ...]
    job_id: str  # unique per job: its idempotency key
    job_started_ms: int
    app_id: str | None = None
    batch_id: int | str | None = None
    base_version: int | None = None  # overwrites: the version replaced
    read_set: ReadSet | None = None  # row-level statements: what they read
    #: The schema version (``Head.schema_version``) the files were written under;
    #: None: not checked (callers that predate schema changes).
    schema_version: int | None = None
    #: A schema change: the table's schema from this version on (Spark JSON).
    new_schema_json: str | None = None
    #: ``DELETE``, ``UPDATE``, ``MERGE``: their change files (the change data feed),
    #: recorded in the version's log record, never among the table's files.
    change_files: tuple[FileEntry, ...] = ()

    def size_bytes(self) -> int:
        """About what the request writes, to bound a group."""
        return 256 + sum(64 + len(f.path) for f in (*self.files, *self.change_files))


#: What a request came to in a commit attempt (see :class:`GroupAttempt`).
NEW, OWN, REPLAY = "new", "own", "replay"


@dataclass(frozen=True, slots=True)
class Staged:
    kind: str  # NEW: written now; OWN: its job_id committed before; REPLAY: its mark did
    version: int
    job_id: str
    gen: int
    gen_start: int

    def new_version(self) -> NewVersion:
        return NewVersion(self.version, self.job_id, self.gen, self.gen_start)


class GroupAttempt:
    """One attempt at committing requests as consecutive versions, in ``tx``.

    Pure per attempt (the retry loop runs it again on a fresh transaction): the
    head is read once and advanced in memory from request to request.
    """

    def __init__(self, tables: TableAccess, name: str, tx: Transaction) -> None:
        self.tables = tables
        self.layout = tables.layout
        self.name = name
        self.tx = tx

    def _read_head_and_marks(
        self, requests: Sequence[CommitRequest]
    ) -> tuple[Head, dict[bytes, int]]:
        """The head, and every job and batch mark the requests could find, in one round
        trip (docs/design/storage.md, "Round trips per commit")."""
        rows: list[bytes] = []
        for r in requests:
            rows.append(Layout.job_mark_row(self.name, r.job_id))
            if r.app_id is not None and r.batch_id is not None:
                rows.append(Layout.mark_row(self.name, r.app_id, r.batch_id))
        head, found = self.tables.read_head_with(
            self.tx, self.name, self.layout.marks, [(row, Layout.COL_MARK) for row in rows]
        )
        return head, {row: int(raw) for (row, _), raw in found.items()}

    def run(self, requests: Sequence[CommitRequest]) -> list[Staged | ConcurrentModificationError]:
        name, layout, tx = self.name, self.layout, self.tx
        # Mark row -> version: those committed before, then those of this group.
        head, marks = self._read_head_and_marks(requests)
        start = head
        out: list[Staged | ConcurrentModificationError] = []
        for r in requests:
            job_row = Layout.job_mark_row(name, r.job_id)
            done = marks.get(job_row)
            if done is not None:
                out.append(Staged(OWN, done, r.job_id, head.gen, head.gen_start))
                continue
            mark_row = None
            if r.app_id is not None and r.batch_id is not None:
                mark_row = Layout.mark_row(name, r.app_id, r.batch_id)
                done = marks.get(mark_row)
                if done is not None:
                    out.append(Staged(REPLAY, done, r.job_id, head.gen, head.gen_start))
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
            schema_conflict = _schema_conflict(name, head, r)
            if schema_conflict is not None:
                out.append(schema_conflict)
                continue
            live: list[FileEntry] | None = None
            if r.read_set is not None:
                live, conflict = find_conflict(
                    tx, self.tables, name, head, r.read_set, judge_added=r.operation != OPTIMIZE
                )
                if conflict is not None:
                    out.append(
                        ConcurrentModificationError(
                            f"{r.operation.lower()} of table {name!r}: {conflict}; nothing "
                            "was committed (run the statement again on the new version)"
                        )
                    )
                    continue
            head = self._write(head, r, job_row, mark_row, live)
            marks[job_row] = head.version
            if mark_row is not None:
                marks[mark_row] = head.version
            out.append(Staged(NEW, head.version, r.job_id, head.gen, head.gen_start))
        if head is not start:
            tx.put(layout.head, Layout.name_row(name), Layout.COL_HEAD, head.encode())
        return out

    def _write(
        self,
        head: Head,
        r: CommitRequest,
        job_row: bytes,
        mark_row: bytes | None,
        live: list[FileEntry] | None,
    ) -> Head:
        """Write ``r`` as the version after ``head``; returns the head after it.

        ``live``: for a row-level statement, the live files at ``head``: those it
        rewrote get removal rows, or, when it starts a new generation, those it did
        not rewrite are carried into it ahead of its own files (``_row_level``).
        """
        name, layout, tx = self.name, self.layout, self.tx
        version = head.version + 1
        # The log time: never below the head's, which a time-travel answer raised
        # above the time it answered for (see ``History.version_at``).
        ms = max(self.tables.clock_ms(), head.last_ms)
        files: Sequence[FileEntry] = r.files
        removals: list[FileEntry] = []
        new_gen = r.operation == OVERWRITE
        if r.read_set is not None and live is not None:
            files, removals, new_gen = self._row_level(head, r, live)
        if new_gen:
            gen, gen_start = head.gen + 1, version
            tx.put(
                layout.gens,
                Layout.gen_row(name, gen),
                Layout.COL_GEN,
                Generation(gen, version, ms).encode(),
            )
        else:
            gen, gen_start = head.gen, head.gen_start
        for index, entry in enumerate(files):
            tx.put(
                layout.files,
                Layout.file_row(name, gen, version, index),
                Layout.COL_FILE,
                entry.encode(),
            )
        for index, entry in enumerate(removals):
            tx.put(
                layout.files,
                Layout.removal_row(name, gen, version, index),
                Layout.COL_REMOVE,
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
            r.change_files,
        )
        tx.put(layout.log, Layout.log_row(name, version), Layout.COL_RECORD, record.encode())
        stamp = str(version).encode()
        tx.put(layout.marks, job_row, Layout.COL_MARK, stamp)
        if mark_row is not None:
            tx.put(layout.marks, mark_row, Layout.COL_MARK, stamp)
        schema_version, schema_break = head.schema_version, head.schema_break
        if r.new_schema_json is not None:
            meta = self.tables.read_meta(tx, name, head)
            new_meta = meta.with_schema(r.new_schema_json, version)
            tx.put(layout.tables, Layout.name_row(name), Layout.COL_META, new_meta.encode())
            self.tables.forget_meta(name)
            schema_version = version
            if r.operation == OVERWRITE:
                schema_break = version
        return Head(
            version,
            gen,
            gen_start,
            ms,
            head.vacuum_cutoff_ms,
            head.min_readable_version,
            schema_version,
            schema_break,
            head.created_ms,
        )

    def _row_level(
        self, head: Head, r: CommitRequest, live: list[FileEntry]
    ) -> tuple[Sequence[FileEntry], list[FileEntry], bool]:
        """A row-level statement's ``(file rows, removal rows, new generation?)``.

        It writes what it changed: a removal row per file it rewrote and a file row
        per file it wrote, in the current generation, whose removal count it
        updates. Once the generation's removal rows would outnumber its live files,
        it starts a new generation of the files it kept and its own instead, so
        listing stays about three rows per live file at most; that copy writes
        fewer rows than the removals before it did, so a statement writes O(files
        it changed) rows amortised.
        """
        gone = set(r.read_set.removes) if r.read_set is not None else set()
        kept = [e for e in live if e.path not in gone]
        removals = [e for e in live if e.path in gone]
        current = self.tables.read_generation(self.tx, self.name, head.gen)
        removed = current.removed + len(removals)
        if removed > len(kept) + len(r.files):
            return [*kept, *r.files], [], True
        if removals:
            self.tx.put(
                self.layout.gens,
                Layout.gen_row(self.name, head.gen),
                Layout.COL_GEN,
                dataclasses.replace(current, removed=removed).encode(),
            )
        return r.files, removals, False


class Commits:
    """Table creation and commits of one catalog, each one transaction at the head."""

    def __init__(self, tables: TableAccess, follow_ups: FollowUps) -> None:
        self._tables = tables
        self._follow_ups = follow_ups

    def create(
        self,
        meta: TableMeta,
        job_id: str,
        retention: Retention | None = None,
        *,
        over_dropped: bool = False,
    ) -> int | None:
        """Create the table at version 0; returns the commit timestamp.

        ``retention``: the table's retention properties (``None``: the defaults),
        written in the same transaction. A dropped table's record at the location
        is deleted in it too, and the head fenced at the drop time
        (``lifecycle.replace_dropped``; ``over_dropped``: the location holds files).
        """
        name, layout = meta.name, self._tables.layout

        def attempt(tx: Transaction) -> int:
            row = Layout.name_row(name)
            if tx.get(layout.tables, row, Layout.COL_META) is not None:
                raise TableExistsError(f"table {name!r} already exists")
            fence = lifecycle.replace_dropped(tx, layout, meta, over_dropped)
            ms = self._tables.clock_ms()
            tx.put(layout.tables, row, Layout.COL_META, meta.encode())
            head = Head(0, 0, 0, ms, vacuum_cutoff_ms=fence, created_ms=meta.created_ms)
            tx.put(layout.head, row, Layout.COL_HEAD, head.encode())
            tx.put(layout.gens, Layout.gen_row(name, 0), Layout.COL_GEN, _gen0(ms))
            record = LogRecord(0, CREATE, ms, 0, 0, job_id, None, None, tx.start_ts)
            tx.put(layout.log, Layout.log_row(name, 0), Layout.COL_RECORD, record.encode())
            if retention is not None:
                write_retention(tx, layout, name, retention)
            return 0

        _, commit_ts = self._tables.transact(attempt, what=f"create table {name!r}", job_id=job_id)
        # The commit point is behind us: nothing below may raise.
        self._follow_ups.run(name, [NewVersion(0, job_id, 0, 0)], commit_ts)
        return commit_ts

    def commit_files(self, name: str, request: CommitRequest) -> Committed:
        """Commit ``request`` as the next version, in one transaction."""
        (result,) = self.commit_group(name, [request])
        if isinstance(result, BaseException):
            raise result
        return result

    def commit_group(
        self, name: str, requests: Sequence[CommitRequest]
    ) -> list[Committed | ConcurrentModificationError]:
        """Commit every request as its own consecutive version, in one transaction.

        See ``Catalog.commit_group``; follow-up work is scheduled, never raised.
        """
        for request in requests:
            _check_request(request)
        if not requests:
            return []
        if len(requests) > 1 and any(r.read_set is not None for r in requests):
            # Its check reads the live files at the head the transaction read, which
            # earlier members of a group would have moved in memory only.
            raise ValueError("a row-level statement commits alone, never in a group")
        what = (
            f"{requests[0].operation.lower()} to table {name!r}"
            if len(requests) == 1
            else f"group commit of {len(requests)} appends to table {name!r}"
        )
        # The turn: no other writer of the head in this process (a group, expiry's
        # publish, a time-travel fence) runs its transaction meanwhile; the follow-up
        # work below runs after it, as it may take the turn itself.
        with self._tables.head_turn(name):
            staged, commit_ts = self._tables.transact(
                lambda tx: GroupAttempt(self._tables, name, tx).run(requests),
                what=what,
                job_id=requests[0].job_id,
            )
        out: list[Committed | ConcurrentModificationError] = []
        fresh: list[NewVersion] = []
        for outcome in staged:
            if isinstance(outcome, ConcurrentModificationError):
                out.append(outcome)
            elif outcome.kind == NEW:
                fresh.append(outcome.new_version())
                out.append(Committed(outcome.version, commit_ts, False, len(requests)))
            else:
                replayed = outcome.kind == REPLAY
                out.append(Committed(outcome.version, None, replayed, len(requests)))
        if fresh:
            # The commit point is behind us: nothing below may raise.
            self._follow_ups.schedule(name, fresh, commit_ts)
        return out

    def commit_tables(self, commits: Sequence[tuple[str, CommitRequest]]) -> list[Committed]:
        """Commit files to several tables in one transaction: all of them, or none.

        See ``Catalog.commit_tables``.
        """
        names = [name for name, _ in commits]
        if len(set(names)) != len(names):
            raise ValueError(f"a multi-table commit names a table more than once: {names}")
        for _, request in commits:
            _check_request(request)
        if not commits:
            return []

        def attempt(tx: Transaction) -> list[Staged]:
            out: list[Staged] = []
            for name, request in commits:
                (staged,) = GroupAttempt(self._tables, name, tx).run([request])
                if isinstance(staged, ConcurrentModificationError):
                    raise staged
                out.append(staged)
            return out

        what = f"commit to tables {', '.join(repr(n) for n in names)}"
        with contextlib.ExitStack() as turns:
            for name in sorted(names):  # one order for every caller: no deadlock
                turns.enter_context(self._tables.head_turn(name))
            staged, commit_ts = self._tables.transact(
                attempt, what=what, job_id=commits[0][1].job_id
            )
        out: list[Committed] = []
        for (name, _), outcome in zip(commits, staged, strict=True):
            fresh = outcome.kind == NEW
            out.append(
                Committed(outcome.version, commit_ts if fresh else None, outcome.kind == REPLAY)
            )
            if fresh:
                self._follow_ups.schedule(name, [outcome.new_version()], commit_ts)  # never raises
        return out


def _schema_conflict(name: str, head: Head, r: CommitRequest) -> ConcurrentModificationError | None:
    """How a concurrent schema change conflicts with ``r`` (docs/design/lakehouse.md).

    A schema change conflicts with any schema change since the schema it started
    from. Files written under an older schema conflict only with a change that made
    them unreadable (an overwrite's new schema): added nullable columns read as NULL
    and widened types read widened, so appends beside ``add_columns`` both commit.
    """
    if r.schema_version is None:
        return None
    if r.new_schema_json is not None and head.schema_version != r.schema_version:
        what = f"version {head.schema_version} changed the schema"
    elif head.schema_break > r.schema_version:
        what = f"version {head.schema_break} replaced the schema"
    else:
        return None
    return ConcurrentModificationError(
        f"{r.operation.lower()} of table {name!r} was prepared under the schema of version "
        f"{r.schema_version}, but {what} meanwhile; nothing was committed (run it again)"
    )


def _check_request(request: CommitRequest) -> None:
    if request.operation not in (APPEND, OVERWRITE, ADD_COLUMNS, *DML_OPERATIONS):
        raise ValueError(f"unknown operation {request.operation!r}")
    if request.new_schema_json is not None and request.schema_version is None:
        raise ValueError("a schema change needs the schema_version it changes")
    if request.operation == ADD_COLUMNS and request.new_schema_json is None:
        raise ValueError("ADD COLUMNS needs its new schema")
    if request.new_schema_json is not None and request.operation not in (
        APPEND,
        OVERWRITE,
        ADD_COLUMNS,
    ):
        raise ValueError(f"{request.operation} cannot change the schema")
    if request.operation == ADD_COLUMNS and request.files:
        raise ValueError("ADD COLUMNS commits no files")
    if request.operation == OVERWRITE and request.base_version is None:
        raise ValueError("an overwrite needs the base_version it replaces")
    if (request.operation in DML_OPERATIONS) != (request.read_set is not None):
        raise ValueError(
            f"{request.operation}: row-level statements, and only they, carry a read set"
        )
    if request.change_files and request.operation not in (DELETE, UPDATE, MERGE):
        raise ValueError(f"{request.operation} has no change files; only DML statements do")
    if request.read_set is not None:
        check_read_set(request.read_set)


def _gen0(ms: int) -> bytes:
    return Generation(0, 0, ms).encode()
