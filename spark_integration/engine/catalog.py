"""The catalog: table metadata in percolake transactions, no Spark involved.

:class:`Catalog` is the one entry point the rest of the package uses (the Spark
side's ``Lakehouse`` and the gateway's service); each of its operations is one
concern in a module of its own, all over one :class:`TableAccess` (the retry loop
at a table's head and the reads every operation starts with):

* ``commit``: creating tables and committing files, one version per job;
* ``follow_ups``: what runs after a commit committed (its commit timestamp,
  checkpoints, expiry), which never raises;
* ``history``: history and time travel;
* ``expiry``: retention properties and expiry passes;
* ``vacuum_plan``: which files vacuum keeps, and its fence in the head.

Reads here take one snapshot each; ``model`` lays the metadata out in cells.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine import lifecycle
from spark_integration.engine.checkpoints import list_gen
from spark_integration.engine.commit import CommitRequest, Commits, Committed
from spark_integration.engine.errors import ConcurrentModificationError
from spark_integration.engine.expiry import Expiry
from spark_integration.engine.follow_ups import FollowUps
from spark_integration.engine.history import History, HistoryEntry
from spark_integration.engine.model import EntryFactory, FileEntry, Head, Layout, TableMeta
from spark_integration.engine.read_set import ReadSet
from spark_integration.engine.retention import ExpireResult, Retention
from spark_integration.engine.table_access import TableAccess
from spark_integration.engine.vacuum_plan import VacuumPlan, fence_vacuum, plan_vacuum
from txn import Manager, Transaction, TransactionManager

E = TypeVar("E")


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


class Catalog:
    """Lakehouse metadata of one catalog, over one transaction manager. Thread-safe.

    ``failpoints`` (tests only) is shared with the ``Lakehouse`` that owns the
    catalog; the catalog hits the points from ``fp.SETTLE_COMMIT`` on.
    ``follow_ups`` and ``commit_ts_of`` are for the gateway's catalog (see
    ``spark_integration.service.servicer``): ``follow_ups`` runs a commit's
    follow-up work later (``None``: before the commit returns); ``commit_ts_of``
    is the commit timestamp of the transaction that began at a start timestamp,
    where the manager can look it up, and a catalog that has it records no commit
    timestamps (history looks each one up by its log record's ``txn_start_ts``).
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
        #: The tables' cells, reached the same way by every operation below.
        self.tables = TableAccess(
            tm,
            Layout(catalog),
            commit_timeout_s=commit_timeout_s,
            failpoints=fp.FailPoints() if failpoints is None else failpoints,
            clock_ms=clock_ms or _wall_clock_ms,
        )
        outcome_of, stamps = commit_ts_of, None
        if isinstance(tm, TransactionManager):
            stamps = tm.store
            outcome_of = outcome_of or tm.outcome_of
        self._expiry = Expiry(self.tables)
        self._commits = Commits(
            self.tables,
            FollowUps(
                self.tables,
                self._expiry,
                run_later=follow_ups,
                record_commit_ts=commit_ts_of is None,
            ),
        )
        self._history = History(self.tables, outcome_of=outcome_of, stamps=stamps)

    @property
    def layout(self) -> Layout:
        return self.tables.layout

    @property
    def failpoints(self) -> fp.FailPoints:
        return self.tables.failpoints

    @property
    def clock_ms(self) -> Callable[[], int]:
        """This process's wall clock in ms (tests inject skewed ones, also afterwards)."""
        return self.tables.clock_ms

    @clock_ms.setter
    def clock_ms(self, clock: Callable[[], int]) -> None:
        self.tables.clock_ms = clock

    # --- reads ------------------------------------------------------------------------

    def meta(self, name: str) -> TableMeta:
        cached = self.tables.cached_meta(name)
        if cached is not None:
            return cached
        with self._tm.begin() as tx:
            return self.tables.read_meta(tx, name)

    def prepare(
        self, name: str, app_id: str | None = None, batch_id: int | str | None = None
    ) -> Prepared:
        """Metadata, head and the batch's earlier version, at one snapshot."""
        with self._tm.begin() as tx:
            head = self.tables.read_head(tx, name)
            meta = self.tables.read_meta(tx, name, head)
            replayed = (
                self.tables.read_mark(tx, name, app_id, batch_id)
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
        tables = self.tables
        with self._tm.begin() as tx:
            head = tables.read_head(tx, name)
            meta = tables.read_meta(tx, name, head)
            if version is None:
                version = head.version
            tables.check_readable(tx, name, head, version)
            if version >= head.gen_start:
                gen, start = head.gen, head.gen_start
            else:
                gen, start = tables.gen_of(tx, name, version)
            files = list_gen(tx, self.layout, name, gen, version, make, gen_start=start)
            return meta, version, files

    # --- table lifecycle (``lifecycle``) ---------------------------------------------

    def drop_table(self, name: str) -> TableMeta:
        """Delete the table's metadata and record its location for vacuum, in one
        transaction; returns the metadata. No file is removed."""
        meta, _ = self.tables.transact(
            lambda tx: lifecycle.drop(tx, self.tables, name),
            what=f"drop table {name!r}",
            settle_unknown=True,
        )
        self.tables.forget_meta(name)
        return meta

    def claim_dropped(
        self, name: str, cutoff_ms: int
    ) -> tuple[list[lifecycle.DroppedTable], list[lifecycle.DroppedTable]]:
        """Delete the records of tables named ``name`` dropped by ``cutoff_ms``, in one
        transaction; returns them and the younger ones. See :func:`lifecycle.claim_dropped`."""
        claimed, _ = self.tables.transact(
            lambda tx: lifecycle.claim_dropped(tx, self.layout, name, cutoff_ms),
            what=f"vacuum of dropped table {name!r}",
            settle_unknown=True,
        )
        return claimed

    def rename_table(self, old: str, new: str) -> None:
        """Move the table to the name ``new`` (free) in one transaction; files stay."""
        self.tables.transact(
            lambda tx: lifecycle.rename(tx, self.tables, old, new),
            what=f"rename table {old!r} to {new!r}",
            settle_unknown=True,
        )
        self.tables.forget_meta(old)
        self.tables.forget_meta(new)

    # --- commits (``commit``) ---------------------------------------------------------

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
        written in the same transaction. ``over_dropped``: the location holds files,
        allowed only over a dropped table's record there (see ``Commits.create``).
        """
        return self._commits.create(meta, job_id, retention, over_dropped=over_dropped)

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
        read_set: ReadSet | None = None,
        schema_version: int | None = None,
        new_schema_json: str | None = None,
        change_files: Sequence[FileEntry] = (),
    ) -> Committed:
        """Commit ``files`` as the next version, in one transaction.

        ``schema_version``: the head's schema version the files were written under;
        ``new_schema_json``: the schema this commit sets (see ``commit._schema_conflict``);
        ``change_files``: a DML statement's change files, recorded in its log record.

        ``APPEND`` adds them; ``OVERWRITE`` makes them the only live files and
        requires the head to still be at ``base_version``. A row-level statement
        (``DELETE``, ``UPDATE``, ``MERGE``, ``REPLACE WHERE``) passes its
        ``read_set``: the files it removes leave the live set and ``files`` join
        it, if the check of ``read_set`` passes at the commit point, else
        :class:`ConcurrentModificationError`.
        """
        request = CommitRequest(
            operation,
            tuple(files),
            job_id,
            job_started_ms,
            app_id,
            batch_id,
            base_version,
            read_set,
            schema_version,
            new_schema_json,
            tuple(change_files),
        )
        return self._commits.commit_files(name, request)

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
        return self._commits.commit_group(name, requests)

    def commit_tables(self, commits: Sequence[tuple[str, CommitRequest]]) -> list[Committed]:
        """Commit files to several tables in one transaction: all of them, or none.

        Each ``(table, request)`` becomes that table's next version, exactly as
        :meth:`commit_files` would make it; a table appears at most once. A request
        failing its own checks fails the whole transaction (nothing of any table is
        committed) with its :class:`ConcurrentModificationError`. A request whose job
        or batch already committed gets that version back, as in :meth:`commit_group`.
        """
        return self._commits.commit_tables(commits)

    # --- history and time travel (``history``) ----------------------------------------

    def version_at(self, name: str, timestamp_ms: int) -> int:
        """The version that was the table's latest at ``timestamp_ms``; repeatable.

        See :meth:`History.version_at`.
        """
        return self._history.version_at(name, timestamp_ms)

    def history(
        self, name: str, *, from_version: int = 0, to_version: int | None = None
    ) -> list[HistoryEntry]:
        """The versions ``from_version..to_version`` (``None``: the latest; the default
        is every version) in order, with the files each one added and removed; expired
        versions (see ``retention``) are left out. Reads only what the range needs."""
        return self._history.history(name, from_version=from_version, to_version=to_version)

    # --- retention (``expiry``) -------------------------------------------------------

    def retention(self, name: str) -> Retention:
        """The table's retention properties (the defaults unless set)."""
        return self._expiry.retention(name)

    def set_retention(self, name: str, retention: Retention) -> None:
        """Change the table's retention properties; the next expiry applies them."""
        self._expiry.set_retention(name, retention)

    def expire(self, name: str, now_ms: int, *, max_rows: int | None = None) -> ExpireResult:
        """Expire what the table's retention no longer keeps, as of ``now_ms``.

        See :meth:`Expiry.expire`.
        """
        return self._expiry.expire(name, now_ms, max_rows=max_rows)

    # --- vacuum (``vacuum_plan``) -----------------------------------------------------

    def vacuum_plan(self, name: str, cutoff_ms: int) -> VacuumPlan:
        """Which files the versions inside the retention can read, at one snapshot.

        See :func:`plan_vacuum`.
        """
        tables = self.tables
        with self._tm.begin() as tx:
            head = tables.read_head(tx, name)
            meta = tables.read_meta(tx, name)
            gens = tables.generations(tx, name)
            return plan_vacuum(tx, self.layout, name, meta, head, gens, cutoff_ms)

    def vacuum_fence(self, name: str, plan: VacuumPlan, cutoff_ms: int) -> set[str]:
        """Publish the cutoff in the head; returns files committed since the plan.

        Retried like a commit; see :func:`fence_vacuum`.
        """

        def attempt(tx: Transaction) -> set[str]:
            head = self.tables.read_head(tx, name)
            return fence_vacuum(tx, self.layout, name, head, plan, cutoff_ms)

        since, _ = self.tables.transact(attempt, what=f"vacuum of table {name!r}")
        return since
