"""The commit protocol of docs/design/protocol.md, steps 1-7, with rules S1-S6.

1. lock the written cells and the transaction's commit lock (liveness only, S5);
2. write every buffered version at ``start_ts``;
3. check write-write conflicts on every written cell (S2: after step 2);
4. take ``commit_ts`` from the oracle (S4: after step 2);
5. SERIALIZABLE: re-read the read set at ``commit_ts``; any difference aborts;
6. put-unless-exists ``start_ts -> commit_ts``: the commit point (S1, S6);
7. release the locks; aborted versions are cleaned up asynchronously.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from lockserver import LockToken
from storage_adapters import Cell, StoreError, VersionWrite
from txn import failpoints as fp
from txn._buffer import WriteBuffer
from txn._isolation import TransactionStatus
from txn._services import cell_lock, commit_lock
from txn._status import ABORTED, TXN_TABLE, decode_outcome, encode_outcome, txn_key
from txn.errors import (
    CommitUnknownError,
    DeadlockError,
    SnapshotTooOldError,
    TransactionAbortedError,
    TransactionConflictError,
)
from wire import metrics

if TYPE_CHECKING:
    from txn._runtime import Runtime
    from txn._transaction import ReadSet

log = logging.getLogger(__name__)

#: Versions inspected per cell and round when looking below ``start_ts`` for a
#: writer that committed after it.
_CONFLICT_PAGE = 16

#: What a conflict means, by the step that found it (the abort reasons of the metrics).
_CONFLICT_REASONS = {"lock": "lock_timeout", "validate": "validation", "commit_point": "lock_lost"}


def _abort_reason(step: str, exc: TransactionAbortedError) -> str:
    if isinstance(exc, SnapshotTooOldError):
        return "snapshot_too_old"
    if isinstance(exc, DeadlockError):
        return "deadlock"
    if isinstance(exc, TransactionConflictError):
        return _CONFLICT_REASONS.get(step, "conflict")
    return "other"


class CommitAttempt:
    """One transaction's attempt to commit, as explicit steps. It owns the commit's state.

    It is handed plain values (the start timestamp, the writes, the read set) and
    never reaches back into the transaction; the transaction reads ``status`` and
    ``commit_ts`` from here once it has handed over. :meth:`run` performs every
    step of :data:`PROTOCOL` in order; tests may call :meth:`step` to interleave the
    steps of several transactions. ``steps`` names the steps to run, so that a test
    can build a deliberately broken protocol (for example ``check`` before ``write``,
    no ``lock``) and show that the checks catch it; production always runs ``COMMIT_STEPS``.
    """

    def __init__(
        self,
        rt: Runtime,
        start_ts: int,
        writes: WriteBuffer,
        reads: ReadSet | None,
        *,
        steps: tuple[str, ...] | None = None,
        read_bounds: Mapping[tuple[str, Cell], int] | None = None,
        held: tuple[LockToken, ...] = (),
    ) -> None:
        """``read_bounds``: the ``for_update_ts`` of each cell the transaction locked with
        ``get_for_update`` (the conflict check reads older writers from there, not from
        ``start_ts``); ``held``: the tokens of those locks, released with the commit's own."""
        self._rt = rt
        self.start_ts = start_ts
        self._writes = writes
        self._reads = reads
        self._read_bounds = dict(read_bounds or {})
        self._held = held
        self._steps = PROTOCOL if steps is None else steps_named(steps)
        self._next = 0
        self._token: LockToken | None = None
        self._wrote = False
        #: The written cells' newest version timestamps, read back by the write step
        #: after each cell's version landed: the conflict check's first page.
        self._written_pages: list[dict[Cell, list[int]]] | None = None
        self.status = TransactionStatus.COMMITTING
        self.commit_ts: int | None = None
        self.outcome: int | None = None
        #: Each step's latency, recorded in the metrics once the commit committed.
        self._seconds: list[tuple[str, float]] = []
        #: When the step running now began (perf_counter): a failure's latency ends it.
        self._step_began = 0.0

    @property
    def next_step(self) -> str | None:
        return self._steps[self._next].name if self._next < len(self._steps) else None

    def run(self) -> int:
        while self.step():
            pass
        if self.commit_ts is None:
            raise TransactionAbortedError("a commit without a commit_ts step cannot commit")
        return self.commit_ts

    def step(self) -> bool:
        """Perform the next step; ``False`` once the transaction has committed."""
        if self._next >= len(self._steps):
            return False
        name, perform = self._steps[self._next]
        start_ts = self.start_ts
        began = self._step_began = time.perf_counter()
        try:
            perform(self)
        except TransactionAbortedError as exc:
            self._fail(TransactionStatus.ABORTED)
            metrics.record_abort(_abort_reason(name, exc))
            raise
        except CommitUnknownError:
            self._fail(TransactionStatus.UNKNOWN)
            metrics.COMMIT_UNKNOWN.inc()
            raise
        except StoreError as exc:
            # A store error other than a timeout (handled inside the commit point)
            # means the write was not applied: definitely not committed.
            self._fail(TransactionStatus.ABORTED)
            metrics.record_store_error(name)
            metrics.record_abort("store_error")
            raise TransactionAbortedError(
                f"transaction {start_ts} aborted: store error in step {name}: {exc}"
            ) from exc
        except Exception as exc:
            if name == "commit_point":  # unexpected: we cannot know what happened
                self._fail(TransactionStatus.UNKNOWN)
                metrics.COMMIT_UNKNOWN.inc()
                raise CommitUnknownError(
                    f"commit point of {start_ts} failed unexpectedly: {exc!r}", start_ts=start_ts
                ) from exc
            # The oracle or the lock server failed before the commit point: nothing
            # can have committed, so this is a clean abort (locks are liveness only).
            self._fail(TransactionStatus.ABORTED)
            metrics.record_abort("other")
            raise TransactionAbortedError(
                f"transaction {start_ts} aborted in step {name}: {exc}"
            ) from exc
        self._seconds.append((name, time.perf_counter() - began))
        self._next += 1
        if self.next_step is None:
            self.status = TransactionStatus.COMMITTED
            self._record_commit()
            return False
        return True

    def _record_commit(self) -> None:
        metrics.COMMITS.inc()
        for name, seconds in self._seconds:
            _STEP_SECONDS[name].observe(seconds)
        metrics.COMMIT_SECONDS.observe(sum(seconds for _, seconds in self._seconds))

    def _fail(self, status: TransactionStatus) -> None:
        self.status = status
        if status is not TransactionStatus.COMMITTED:
            self.commit_ts = None
        if status is TransactionStatus.ABORTED and self._wrote:
            _abandon(self._rt, self.start_ts, self._writes, entry_written=self.outcome == ABORTED)
        _release(self._rt, self._token)
        release_all(self._rt, self._held)
        self._next = len(self._steps)
        # A failed commit's latency: the steps that ran, the one that failed and the
        # clean-up above, what its client waited before it learned the outcome.
        seconds = sum(s for _, s in self._seconds) + time.perf_counter() - self._step_began
        outcome = "unknown" if status is TransactionStatus.UNKNOWN else "aborted"
        metrics.COMMIT_FAILED_SECONDS_BY_OUTCOME[outcome].observe(seconds)

    def _lock(self) -> None:
        self._token = _lock(self._rt, self.start_ts, self._writes)
        self._rt.failpoints.hit(fp.AFTER_LOCK, self.start_ts)

    def _write(self) -> None:
        self._wrote = True  # from here on, some versions may exist in the store
        self._written_pages = _write_versions(self._rt, self.start_ts, self._writes)
        self._rt.failpoints.hit(fp.AFTER_WRITE, self.start_ts)

    def _check(self) -> None:
        _check_write_conflicts(
            self._rt,
            self.start_ts,
            self._writes,
            self._read_bounds,
            first_pages=self._written_pages,
        )
        self._rt.failpoints.hit(fp.AFTER_CONFLICT_CHECK, self.start_ts)

    def _commit_ts(self) -> None:
        self.commit_ts = self._rt.timestamps.next_timestamp()
        self._rt.failpoints.hit(fp.AFTER_COMMIT_TS, self.start_ts)

    def _validate(self) -> None:
        if self._reads is not None:
            assert self.commit_ts is not None
            _validate_reads(self._rt, self.start_ts, self.commit_ts, self._reads)

    def _commit_point(self) -> None:
        assert self.commit_ts is not None
        # The conflict check and validation read below the snapshot: they count only
        # if garbage collection swept nothing they needed meanwhile (rule S8).
        self._rt.guard.check(self.start_ts)
        self.outcome = _commit_point(self._rt, self.start_ts, self.commit_ts)
        if self.outcome == ABORTED:
            raise TransactionConflictError(
                f"transaction {self.start_ts} was aborted by a concurrent reader or "
                "writer that found it stalled (its locks were lost or expired)"
            )

    def _release(self) -> None:
        _release(self._rt, self._token)
        release_all(self._rt, self._held)
        self._rt.failpoints.hit(fp.AFTER_RELEASE, self.start_ts)


class CommitStep(NamedTuple):
    """One step of the protocol: its name (the metrics label, and how a test build
    names it) and the method of :class:`CommitAttempt` that performs it."""

    name: str
    perform: Callable[[CommitAttempt], None]


#: The protocol's steps in the order docs/design/protocol.md prescribes (S2: write
#: before check; S4: commit_ts after write; S1: the commit point is step 6).
PROTOCOL: tuple[CommitStep, ...] = (
    CommitStep("lock", CommitAttempt._lock),
    CommitStep("write", CommitAttempt._write),
    CommitStep("check", CommitAttempt._check),
    CommitStep("commit_ts", CommitAttempt._commit_ts),
    CommitStep("validate", CommitAttempt._validate),
    CommitStep("commit_point", CommitAttempt._commit_point),
    CommitStep("release", CommitAttempt._release),
)

#: The steps' names in protocol order: how a caller names them (``commit_steps``).
COMMIT_STEPS: tuple[str, ...] = tuple(step.name for step in PROTOCOL)

_STEP_BY_NAME: dict[str, CommitStep] = {step.name: step for step in PROTOCOL}


def steps_named(names: tuple[str, ...]) -> tuple[CommitStep, ...]:
    """The steps ``names`` names, in that order; ``ValueError`` for a name not in the protocol."""
    unknown = set(names) - set(COMMIT_STEPS)
    if unknown:
        raise ValueError(f"unknown commit steps {sorted(unknown)}; the steps are {COMMIT_STEPS}")
    return tuple(_STEP_BY_NAME[name] for name in names)


#: Each step's latency histogram (``percolake_commit_step_seconds``), bound once.
_STEP_SECONDS = {step: metrics.COMMIT_STEP_SECONDS.labels(step=step) for step in COMMIT_STEPS}


def _lock(rt: Runtime, start_ts: int, writes: WriteBuffer) -> LockToken | None:
    descriptors = [commit_lock(start_ts)]
    for table, cells in writes.tables():
        descriptors.extend(cell_lock(table, c.row, c.column) for c in cells)
    token = rt.locks.lock(
        descriptors,
        str(start_ts),
        rt.config.lease_ms,
        wait_timeout_ms=rt.config.lock_wait_ms,
        priority=start_ts,  # oldest first, as get_for_update's waits
    )
    if token is None:
        raise TransactionConflictError(
            f"transaction {start_ts} timed out after {rt.config.lock_wait_ms} ms "
            "waiting for locks held by a concurrent committer"
        )
    return token


def _release(rt: Runtime, token: LockToken | None) -> None:
    if token is None:
        return
    try:
        rt.locks.unlock(token)
    except Exception as exc:
        # Locks only serve liveness (S5): a lost lock needs no release.
        log.debug("could not release locks %s: %s", token, exc)


def release_all(rt: Runtime, tokens: tuple[LockToken, ...]) -> None:
    """Release ``get_for_update`` grants, best effort: locks are liveness only (S5)."""
    for token in tokens:
        _release(rt, token)


def _write_versions(rt: Runtime, start_ts: int, writes: WriteBuffer) -> list[dict[Cell, list[int]]]:
    """Every table's versions in one store call, each written cell read back (its newest
    ``_CONFLICT_PAGE`` version timestamps) once its own version landed: the first page of
    the conflict check (step 3), which reads nothing more for most commits.

    A store whose requests overlap sends the writes together and each cell's read as
    soon as the write holding its version succeeded
    (KVStore.put_versions_read_back_of_tables), so the check's first read costs no
    round of its own. Rule S2 holds per cell: of two writers of a cell, the one whose
    version landed last reads after both versions landed, so it sees the other
    (docs/design/protocol.md, "The conflict check's first read"). The step still
    returns only once every version of every table landed (S4: ``commit_ts`` is taken
    after it).
    """
    return rt.store.put_versions_read_back_of_tables(
        [
            (table, [VersionWrite(c.row, c.column, start_ts, v) for c, v in cells.items()])
            for table, cells in writes.tables()
        ],
        limit=_CONFLICT_PAGE,
    )


def _check_write_conflicts(
    rt: Runtime,
    start_ts: int,
    writes: WriteBuffer,
    read_bounds: Mapping[tuple[str, Cell], int] | None = None,
    *,
    first_pages: list[dict[Cell, list[int]]] | None = None,
) -> None:
    """First committer wins: abort if a writer of one of our cells committed in our way.

    Writer W of cell c conflicts when W.start > T.start and W committed, or
    W.start < T.start and W.commit > bound(c), where bound(c) is T.start, or the
    ``for_update_ts`` at which T read c under its lock (``read_bounds``, from
    ``get_for_update``). Below T.start the newest writer that committed before bound(c)
    ends the search: an older writer committing after it would have conflicted with
    that one, and at most one of the two can commit (docs/design/protocol.md,
    "Pessimistic reads").

    ``first_pages``: every table's first page (newest ``_CONFLICT_PAGE`` version
    timestamps of its cells, in the order of ``writes.tables()``), as the write step
    read it back after each cell's version landed. Without it (a test's protocol that
    checks before it writes) the first page of every table is read here in one store
    call (KVStore.get_version_timestamps_of_tables). Each table's check then goes on
    from its page, the tables one after another.
    """
    bounds = read_bounds or {}
    tables = [(table, list(cells)) for table, cells in writes.tables()]
    pages = (
        rt.store.get_version_timestamps_of_tables(tables, limit=_CONFLICT_PAGE)
        if first_pages is None
        else first_pages
    )
    for (table, keys), page in zip(tables, pages, strict=True):
        table_bounds = {c: bounds[(table, c)] for c in keys if (table, c) in bounds}
        _check_table_conflicts(rt, table, keys, start_ts, table_bounds, first_page=page)


def _check_table_conflicts(
    rt: Runtime,
    table: str,
    keys: list[Cell],
    start_ts: int,
    read_bounds: Mapping[Cell, int] | None = None,
    *,
    first_page: Mapping[Cell, list[int]] | None = None,
) -> None:
    """The conflict check of one table's ``keys``; ``first_page``: their newest
    ``_CONFLICT_PAGE`` version timestamps, read already (read here when ``None``)."""
    # One newest-first read usually shows every newer writer and the newest older ones;
    # only cells with long histories need more reads. A writer that began after us
    # conflicts whenever it commits, whatever the cell's bound: its version sorts above
    # ours, and readers take the newest committed version by start timestamp, so it
    # must not commit before us (it did, if it committed at all by the time we check).
    bounds = read_bounds or {}
    wanted = set(keys)
    page = (
        rt.store.get_version_timestamps(table, keys, limit=_CONFLICT_PAGE)
        if first_page is None
        else {cell: tss for cell, tss in first_page.items() if cell in wanted}
    )
    newer: set[int] = set()
    where: dict[int, tuple[str, Cell]] = {}  # a cell of each writer, for the resolver
    older: dict[Cell, list[int]] = {}
    below_bound: dict[Cell, int] = {}  # where to read on when the page was full
    for cell, tss in page.items():
        for ts in tss:
            where.setdefault(ts, (table, cell))
        newer.update(ts for ts in tss if ts > start_ts)
        older[cell] = [ts for ts in tss if ts < start_ts]
        if len(tss) == _CONFLICT_PAGE:
            lowest = tss[-1]
            if lowest > start_ts:  # newer versions may go on below this page
                rest = rt.store.get_version_timestamps(
                    table, [cell], above_ts=start_ts, below_ts=lowest
                )
                for ts in rest.get(cell, []):
                    newer.add(ts)
                    where.setdefault(ts, (table, cell))
            below_bound[cell] = min(lowest, start_ts)
    # A writer whose version is GONE (deleted since it was listed) was aborted, or was
    # swept below the safe point, which a live transaction's start_ts is above: it is
    # skipped like an aborted one (rule S9).
    if newer:
        outcomes = rt.resolver.resolve(newer, where=where)
        for ts in sorted(newer):
            if outcomes[ts] >= 0:
                raise TransactionConflictError(
                    f"write-write conflict in {table!r}: transaction {ts} started after "
                    f"{start_ts} and committed first"
                )
    while older:
        outcomes = rt.resolver.resolve({ts for tss in older.values() for ts in tss}, where=where)
        next_bound: dict[Cell, int] = {}
        for cell, tss in older.items():
            for ts in tss:
                outcome = outcomes[ts]
                if outcome < 0:  # ABORTED or GONE
                    continue
                # Every ts here is below start_ts: our own version (at start_ts) is never
                # among them, even when the bound (a for_update_ts) lies above it.
                bound = bounds.get(cell, start_ts)
                if outcome > bound:
                    raise TransactionConflictError(
                        f"write-write conflict in {table!r}: transaction {ts} committed "
                        f"at {outcome}, after {start_ts} "
                        + ("started" if bound == start_ts else f"read the cell at {bound}")
                    )
                break  # committed before we read the cell: no older writer matters
            else:
                if cell in below_bound:  # every older version seen was aborted: read on
                    next_bound[cell] = min([below_bound[cell], *tss])
        older, below_bound = {}, {}
        for bound in set(next_bound.values()):
            group = [c for c, b in next_bound.items() if b == bound]
            got = rt.store.get_version_timestamps(
                table, group, below_ts=bound, limit=_CONFLICT_PAGE
            )
            for cell, tss in got.items():
                older[cell] = tss
                for ts in tss:
                    where.setdefault(ts, (table, cell))
                if len(tss) == _CONFLICT_PAGE:
                    below_bound[cell] = tss[-1]


def _validate_reads(rt: Runtime, start_ts: int, commit_ts: int, reads: ReadSet) -> None:
    """SERIALIZABLE: everything read at ``start_ts`` must read the same at ``commit_ts``."""
    by_table: dict[str, list[Cell]] = {}
    for table, cell in reads.cells:
        by_table.setdefault(table, []).append(cell)
    for table, cells in by_table.items():
        now = rt.reader.read_cells(table, cells, commit_ts, skip_ts=start_ts)
        for cell in cells:
            if now.get(cell) != reads.cells[(table, cell)]:
                raise TransactionConflictError(
                    f"serialization failure: {table!r} cell {cell.row!r}/{cell.column!r} "
                    f"changed between {start_ts} and {commit_ts}"
                )
    for scan in reads.scans:
        if scan.upto is None and not scan.exhausted:
            continue  # nothing was iterated, nothing was read
        end_row = scan.end_row
        now_seen = []
        for row, column, value in rt.reader.scan(
            scan.table,
            scan.start_row,
            end_row,
            commit_ts,
            skip_ts=start_ts,
            page_size=rt.config.scan_page_size,
        ):
            if not scan.exhausted and scan.upto is not None and Cell(row, column) > scan.upto:
                break
            if value is not None:
                now_seen.append((row, column, value))
        seen_then = [
            e
            for e in scan.observed
            if scan.exhausted or scan.upto is None or Cell(e[0], e[1]) <= scan.upto
        ]
        if now_seen != seen_then:
            raise TransactionConflictError(
                f"serialization failure: scan of {scan.table!r} from {scan.start_row!r} "
                f"changed between {start_ts} and {commit_ts} (phantom or update)"
            )


def _commit_point(rt: Runtime, start_ts: int, commit_ts: int) -> int:
    """Put-unless-exists ``start_ts -> commit_ts``; returns the outcome that stands."""
    key, value = txn_key(start_ts), encode_outcome(commit_ts)
    try:
        rt.failpoints.hit(fp.BEFORE_COMMIT_POINT, start_ts)
        result = rt.store.put_unless_exists(TXN_TABLE, key, value)
        rt.failpoints.hit(fp.AFTER_COMMIT_POINT, start_ts)
    except StoreError as exc:
        # Any store error here, not only a timeout, leaves the outcome open: with
        # Cassandra's Paxos v1 an Unavailable can come after a quorum accepted the
        # proposal, and a later round completes it. Only a clean "not applied" (a
        # result, not an error) is a definite answer. Settle it (S6).
        log.warning("commit point of %d failed; settling it (S6): %s", start_ts, exc)
        metrics.record_store_error("commit_point")
        return _settle(rt, start_ts, commit_ts, exc)
    assert result.current is not None
    outcome = decode_outcome(result.current)
    rt.resolver.remember(start_ts, outcome)
    if outcome not in (commit_ts, ABORTED):
        raise CommitUnknownError(  # pragma: no cover - only one writer uses this key
            f"transactions-table entry of {start_ts} holds a foreign commit timestamp {outcome}",
            start_ts=start_ts,
        )
    return outcome


def _settle(rt: Runtime, start_ts: int, commit_ts: int, first: Exception) -> int:
    """Settle an ambiguous commit point by re-issuing it (idempotent, rule S6).

    Re-issuing cannot commit a transaction that meant to abort: this one meant to
    commit. Finding our own value means an earlier attempt applied.
    """
    key, value = txn_key(start_ts), encode_outcome(commit_ts)
    last: Exception = first
    for attempt in range(rt.config.settle_attempts):
        time.sleep(rt.config.settle_backoff_ms / 1000 * attempt)
        try:
            rt.failpoints.hit(fp.SETTLE_COMMIT, start_ts)
            result = rt.store.put_unless_exists(TXN_TABLE, key, value)
        except StoreError as exc:
            metrics.record_store_error("commit_point")
            last = exc
            continue
        assert result.current is not None
        outcome = decode_outcome(result.current)
        rt.resolver.remember(start_ts, outcome)
        return outcome
    raise CommitUnknownError(
        f"commit of transaction {start_ts} has an unknown outcome after "
        f"{rt.config.settle_attempts} attempts to settle it: {last}",
        start_ts=start_ts,
    ) from last


def _abandon(
    rt: Runtime, start_ts: int, writes: WriteBuffer, *, entry_written: bool = False
) -> None:
    """Mark ourselves aborted so readers need not wait, then queue our versions' removal."""
    if not entry_written:
        try:
            # Our own ABORTED: we never try the commit point again, so once the cleaner
            # removed our versions it removes this entry too (rule S9).
            outcome = rt.resolver.settle_aborted(start_ts, own=True)
        except StoreError as exc:
            metrics.record_store_error("abandon")
            # Readers will settle us (S3); until then the versions stay, invisible.
            log.debug("could not record abort of %d: %s", start_ts, exc)
            return
        if outcome != ABORTED:  # pragma: no cover - we never attempted the commit point
            log.error("transaction %d found committed while abandoning it", start_ts)
            return
    rt.cleaner.submit_abandoned(
        start_ts,
        [(table, [(c.row, c.column, start_ts) for c in cells]) for table, cells in writes.tables()],
    )
