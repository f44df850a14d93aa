"""Garbage collection: sweep versions below the safe point, collect the transactions
table (rules S8, S9; see docs/design/gc.md).

One pass (:meth:`GarbageCollector.run_once`):

1. **Safe point.** ``sp = min(retention point, oldest live registered transaction)``,
   never lower than the last one. The retention point is the newest timestamp known to
   have been served at least ``retention_s`` ago (samples of ``(wall time, timestamp)``
   from this collector's oracle and the managers' registrations). A higher ``sp`` is
   written to the ``_gc`` state row first; then nothing is deleted until ``grace_ms``
   later (by this process's monotonic clock, counted from when it read or wrote the
   row), which is what lets readers hold a lease on the row (``SafePointGuard``).
2. **Sweep**, every table, page by page of cells: of the versions below ``sp`` each
   writer's outcome is its stamp or its entry (a writer with no entry is settled
   ABORTED, rule S3: it started below the safe point). Aborted versions are deleted.
   Committed ones are stamped with their commit timestamp (a commit stamp, like
   Percolator's write record). Of those committed below ``sp`` the newest is kept, the
   older ones deleted, and the kept one deleted too, last, if it is a delete.
3. **Transactions table.** The entry of a writer that committed below ``sp`` is deleted
   (compare-and-delete) once the whole sweep is done: it committed before a timestamp
   this pass read before sweeping, so every version it wrote existed when the sweep
   began and was stamped or deleted by it (S9). A writer's own ABORTED (it abandoned its
   commit) is deleted once its versions are; an ABORTED written by anyone else stays:
   it fences a writer that may still be alive from reaching its commit point.

**Resumable.** A pass saves how far it swept, every ``cursor_every_s``, in the ``_gc``
row ``cursor`` (:class:`GcCursor`: its safe point and the last cell fully swept). A
pass that finds a live cursor resumes it instead of starting afresh: it sweeps below
the *cursor's* safe point, only the cells after the cursor, deletes the entries of the
writers it met there, and does not raise ``collected_below`` (it never met the writers
whose versions all lie before the cursor; a later pass meets their stamps). The
argument is in docs/design/gc.md, "Resumable passes".
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from lockserver import LockTable
from storage_adapters import (
    Cell,
    KVStore,
    StoreError,
    Version,
    VersionStamp,
)
from txn._config import TransactionConfig
from txn._safepoint import (
    CLIENTS_KEY,
    DEFAULT_GRACE_MS,
    GC_TABLE,
    STATE_KEY,
    GcState,
    decode_clients,
    read_state,
)
from txn._services import LockService, TimestampSource
from txn._status import (
    ABORTED,
    OWN_ABORTED_VALUE,
    TXN_TABLE,
    StatusResolver,
    encode_outcome,
    txn_key,
)
from wire import metrics
from wire.errors import PercolakeError

log = logging.getLogger(__name__)

#: Samples of (wall time, timestamp) kept beyond the retention, at most.
MAX_SAMPLES = 1000

#: Transactions-table entries a pass deletes per store call (KVStore.delete_system_many;
#: on Cassandra one read and one delete per entry, without Paxos, in batches).
ENTRY_DELETES_PER_CALL = 5000

#: A collector prunes a table's dead cells (KVStore.prune_cells) at most this often.
DEFAULT_PRUNE_EVERY_S = 60.0

#: The ``_gc`` row holding the cursor of an unfinished pass. A row of its own, not a
#: field of ``state``: saving progress does not contend with raising the safe point.
CURSOR_KEY = b"cursor"

#: How often a pass saves its cursor by default: a system write every few seconds, not
#: every page.
DEFAULT_CURSOR_EVERY_S = 5.0


class GcStoppedError(PercolakeError):
    """A pass ended by :meth:`GarbageCollector.stop` (a server stopping) at a wait or
    between tables: it deleted nothing its grace did not allow."""


@dataclass(frozen=True, slots=True)
class GcCursor:
    """How far a pass at ``safe_point`` swept: every cell of the tables before
    ``table`` (by name) and of ``table`` up to ``(row, column)`` included was swept
    below ``safe_point`` by that pass, or by it and the passes it resumed."""

    safe_point: int
    table: str
    row: bytes
    column: bytes

    @property
    def position(self) -> tuple[str, bytes, bytes]:
        return (self.table, self.row, self.column)

    def ahead_of(self, other: GcCursor) -> bool:
        """Whether this cursor says at least as much as ``other``: a higher safe point
        (a newer pass), or the same one swept at least as far."""
        if self.safe_point != other.safe_point:
            return self.safe_point > other.safe_point
        return self.position >= other.position

    def describe(self) -> str:
        return (
            f"table {self.table!r}, row {_show(self.row)}, column {_show(self.column)} "
            f"(safe point {self.safe_point})"
        )

    def encode(self) -> bytes:
        return json.dumps(
            {
                "safe_point": self.safe_point,
                "table": self.table,
                "row": self.row.hex(),
                "column": self.column.hex(),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> GcCursor:
        try:
            got = json.loads(raw)
            return cls(
                safe_point=int(got["safe_point"]),
                table=str(got["table"]),
                row=bytes.fromhex(got["row"]),
                column=bytes.fromhex(got["column"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"corrupt garbage-collection cursor row {raw[:200]!r}") from exc


def _show(key: bytes, limit: int = 40) -> str:
    return repr(key) if len(key) <= limit else f"{key[:limit]!r}... ({len(key)} bytes)"


@dataclass(slots=True)
class GcReport:
    """What one pass did."""

    safe_point: int = 0
    tables: int = 0
    cells: int = 0
    versions_deleted: int = 0
    versions_stamped: int = 0
    entries_deleted: int = 0
    #: Cells with no version left that scans no longer read (Cassandra's index prune).
    cells_pruned: int = 0
    seconds: float = 0.0
    note: str = ""
    #: Where the unfinished pass this one resumed had stopped ("": a pass from the start).
    resumed_from: str = ""
    #: The grace this pass waited by (ms): its own, or a longer one the state row held
    #: (readers may hold leases under it; see GarbageCollector._raise_safe_point).
    grace_ms: int = 0
    #: This collector's own grace, when the state row's longer one was waited instead.
    grace_asked_ms: int | None = None

    def summary(self) -> str:
        if self.note:
            return self.note
        resumed = f" (resumed after {self.resumed_from})" if self.resumed_from else ""
        grace = f"grace {self.grace_ms} ms"
        if self.grace_asked_ms is not None:
            grace += f" (the state row's, above the {self.grace_asked_ms} ms asked)"
        return (
            f"safe point {self.safe_point}{resumed}, {grace}: {self.tables} tables, "
            f"{self.cells} cells; deleted {self.versions_deleted} versions, stamped "
            f"{self.versions_stamped}, deleted {self.entries_deleted} transactions-table "
            f"entries, pruned {self.cells_pruned} dead cells in {self.seconds:.1f} s"
        )


@dataclass(slots=True)
class _Pass:
    safe_point: int
    report: GcReport
    #: Entries of writers committed below this were collected by a finished pass.
    collected_below: int = 0
    #: Writers committed below the safe point (start_ts -> commit_ts): entries to delete.
    committed: dict[int, int] = field(default_factory=dict)
    #: Writers found aborted whose versions this pass deleted: own entries to try.
    aborted: set[int] = field(default_factory=set)
    #: The cursor this pass resumed (None: it sweeps from the start).
    resumed: GcCursor | None = None
    #: The cursor row's value as last read or written (for compare-and-set), and
    #: whether that is still known (not after a failed write).
    cursor_raw: bytes | None = None
    cursor_known: bool = True
    #: When the cursor was last saved (monotonic).
    saved_at: float = 0.0
    #: Cells of the table being swept that this pass left without a version below
    #: the safe point (every one it found there deleted): what to prune between the
    #: full prunes (KVStore.prune_emptied_cells).
    emptied: list[Cell] = field(default_factory=list)


class GarbageCollector:
    """Runs passes of garbage collection over one store. Safe to run in several
    processes at once (each step is idempotent, the safe point only rises)."""

    def __init__(
        self,
        store: KVStore,
        *,
        timestamps: TimestampSource | None = None,
        locks: LockService | None = None,
        retention_s: float = 600.0,
        grace_ms: int = DEFAULT_GRACE_MS,
        page_cells: int = 500,
        max_versions_per_s: float | None = None,
        cursor_every_s: float = DEFAULT_CURSOR_EVERY_S,
        prune_every_s: float = DEFAULT_PRUNE_EVERY_S,
        config: TransactionConfig | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        """``sleep``: how the collector waits (its grace, its rate limit); by default an
        event that :meth:`stop` sets, so a stopping server does not wait out a grace."""
        if retention_s < 0:
            raise ValueError(f"retention_s must be >= 0, got {retention_s}")
        if grace_ms < 0:
            raise ValueError(f"grace_ms must be >= 0, got {grace_ms}")
        if page_cells < 1:
            raise ValueError(f"page_cells must be positive, got {page_cells}")
        if max_versions_per_s is not None and max_versions_per_s <= 0:
            raise ValueError(f"max_versions_per_s must be positive, got {max_versions_per_s}")
        if cursor_every_s < 0:
            raise ValueError(f"cursor_every_s must be >= 0, got {cursor_every_s}")
        if prune_every_s < 0:
            raise ValueError(f"prune_every_s must be >= 0, got {prune_every_s}")
        self._store = store
        self._timestamps = timestamps
        self._resolver = StatusResolver(store, locks or LockTable(), config or TransactionConfig())
        self._retention_ms = int(retention_s * 1000)
        self._grace_ms = grace_ms
        self._page_cells = page_cells
        self._rate = max_versions_per_s
        self._cursor_every_s = cursor_every_s
        self._prune_every_s = prune_every_s
        self._pruned_at: dict[str, float] = {}  # table -> when this process pruned it
        self._clock = clock
        self._monotonic = monotonic
        self._stopping = threading.Event()
        self._sleep = sleep if sleep is not None else self._stopping.wait
        #: The safe point this process last saw in the row, and since when (monotonic).
        self._seen: tuple[int, float] | None = None
        #: The lowering of the grace (id, the grace lowered from) in the row this pass
        #: wrote, and when it wrote it (monotonic): what it may clear at its end.
        self._lowering: tuple[str, int, float] | None = None

    # --- the safe point -------------------------------------------------------------

    def _raise_safe_point(self) -> tuple[int, int, int, int]:
        """Publish the pass's safe point; returns it, the grace still to wait (ms), the
        row's ``collected_below`` and the grace this pass waits by (ms).

        Lowering the grace (rule S8): readers lease the row for half the grace it held
        when they read it, so a pass whose row held a longer grace, or still records
        one it was lowered from (``lowered_from_ms``), waits that one, and so does every
        pass, in any process, until the lowering is cleared (:meth:`_finish`). Only then
        does ``grace_ms`` alone govern. A lowering is never silent: it is logged.
        """
        for _ in range(20):
            read_at = self._monotonic()
            state, raw = read_state(self._store)
            now_ms = int(self._clock() * 1000)
            samples = list(state.samples)
            if self._timestamps is not None:
                samples.append((now_ms, self._timestamps.next_timestamp()))
            clients = decode_clients(
                self._store.get_system(GC_TABLE, [CLIENTS_KEY]).get(CLIENTS_KEY)
            )
            samples.extend((c.wall_ms, c.latest_ts) for c in clients.values() if c.latest_ts)
            samples = _thin(sorted(set(samples)), now_ms - self._retention_ms)
            old_enough = [ts for wall, ts in samples if wall <= now_ms - self._retention_ms]
            candidate = max(old_enough, default=0)
            oldest = [c.oldest for c in clients.values() if c.live(now_ms) and c.oldest]
            if oldest:
                candidate = min(candidate, *oldest)
            safe_point = max(state.safe_point, candidate)
            leased_ms = max(state.grace_ms, state.lowered_from_ms)  # the longest lease x2
            grace_ms = max(leased_ms, self._grace_ms)
            if self._grace_ms >= leased_ms:
                lowered_from, lowering = 0, ""  # this grace covers every lease
            elif self._grace_ms < state.grace_ms:  # lowered by this write: a new lowering
                lowered_from, lowering = leased_ms, uuid.uuid4().hex[:16]
            else:
                lowered_from, lowering = state.lowered_from_ms, state.lowering
            new = GcState(
                safe_point,
                self._grace_ms,
                state.collected_below,
                tuple(samples),
                state.last_pass,
                lowered_from_ms=lowered_from,
                lowering=lowering,
            )
            if self._store.compare_and_set(GC_TABLE, STATE_KEY, raw, new.encode()).applied:
                written_at = self._monotonic()
                if safe_point > 0:
                    # Its age: since the last sample at or below it was handed out.
                    walls = [wall for wall, ts in samples if ts <= safe_point]
                    metrics.record_gc_safe_point(safe_point, max(walls) / 1000 if walls else None)
                self._lowering = (lowering, lowered_from, written_at) if lowering else None
                if grace_ms > self._grace_ms:
                    log.warning(
                        "garbage collection waits the grace of %d ms readers may hold leases "
                        "under, not the %d ms asked (--grace-ms): %s",
                        grace_ms,
                        self._grace_ms,
                        "the shorter one applies once no such lease can be valid"
                        if lowering
                        else "the state row's grace is longer",
                    )
                collected = state.collected_below
                if self._seen is not None and self._seen[0] == safe_point:
                    waited_ms = (read_at - self._seen[1]) * 1000
                    return safe_point, max(0, int(grace_ms - waited_ms)), collected, grace_ms
                self._seen = (safe_point, read_at)
                return safe_point, grace_ms, collected, grace_ms
        raise RuntimeError("could not update the garbage-collection state row: contention")

    def _finish(self, run: _Pass) -> None:
        # Only a pass that swept everything from the start at its safe point met every
        # writer committed below it. A resumed one never met the writers whose versions
        # all lie before its cursor: their entries stay, and their stamps (outcome at or
        # above collected_below) are what lets a later pass find and delete them.
        collected = run.safe_point if run.resumed is None else 0
        for _ in range(20):
            state, raw = read_state(self._store)
            new = replace(
                state,
                collected_below=max(state.collected_below, collected),
                last_pass=asdict(run.report),
            )
            if self._lowering is not None and state.lowering == self._lowering[0]:
                _, lowered_from, written_at = self._lowering
                # The lowering was written before this pass's raise; a lease read under
                # the longer grace ran out lowered_from ms after it at the latest.
                if (self._monotonic() - written_at) * 1000 >= lowered_from:
                    new = replace(new, lowered_from_ms=0, lowering="")
            if self._store.compare_and_set(GC_TABLE, STATE_KEY, raw, new.encode()).applied:
                return
        log.warning("could not record the garbage-collection pass: contention on the state row")

    # --- a pass ---------------------------------------------------------------------

    def run_once(self, progress: Callable[[str], None] | None = None) -> GcReport:
        """One pass: resume the unfinished pass a cursor records, if any; else raise the
        safe point and sweep every table. Then collect entries."""
        started = self._monotonic()
        self._check_stopping()
        run = self._resume()
        if run is None:
            safe_point, wait_ms, collected_below, grace_ms = self._raise_safe_point()
            report = GcReport(safe_point=safe_point, grace_ms=grace_ms)
            if grace_ms != self._grace_ms:
                report.grace_asked_ms = self._grace_ms
            if safe_point <= 0:
                report.note = (
                    "nothing to collect yet: no timestamp is known to be "
                    f"{self._retention_ms / 1000:g} s old (this pass recorded the time, so a "
                    "later one can)"
                )
                report.seconds = self._monotonic() - started
                metrics.record_gc_pass(report.seconds, 0, 0)
                return report
            if wait_ms:
                log.info(
                    "garbage collection waits %d ms before sweeping below %d", wait_ms, safe_point
                )
                self._wait(wait_ms / 1000)
            run = _Pass(safe_point, report, collected_below, cursor_known=False)
        run.saved_at = self._monotonic()
        for table in sorted(self._store.tables()):
            if run.resumed is not None and table < run.resumed.table:
                continue  # swept by the pass this one resumes
            self._check_stopping()
            if progress is not None:
                progress(table)
            run.emptied = []
            self._sweep_table(run, table)
            run.report.cells_pruned += _prune(self._store, table, run, self._prune_due(table))
            run.report.tables += 1
        self._collect_entries(run)
        run.report.seconds = self._monotonic() - started
        self._clear_cursor(run)
        self._finish(run)
        log.info("garbage collection: %s", run.report.summary())
        metrics.record_gc_pass(
            run.report.seconds, run.report.versions_deleted, run.report.entries_deleted
        )
        return run.report

    # --- the cursor -----------------------------------------------------------------

    def _resume(self) -> _Pass | None:
        """The unfinished pass to resume, from the cursor row; None to start afresh.

        A cursor is live while its safe point is above ``collected_below`` (no pass at
        or above it finished) and not above the state row's safe point (the row backs
        it: readers were told). A resumed pass sweeps below the cursor's safe point even
        if the row's is higher now: the cells before the cursor were swept below that
        one only, and sweeping below a lower safe point deletes less. It does not wait
        the grace: the pass that wrote the cursor waited it before deleting anything.
        """
        for _ in range(20):
            state, _ = read_state(self._store)
            raw = self._store.get_system(GC_TABLE, [CURSOR_KEY]).get(CURSOR_KEY)
            if raw is None:
                return None
            try:
                cursor: GcCursor | None = GcCursor.decode(raw)
            except StoreError as exc:
                log.warning("garbage collection drops its cursor and starts afresh: %s", exc)
                cursor = None
            if cursor is not None and state.collected_below < cursor.safe_point:
                if cursor.safe_point <= state.safe_point:
                    log.info("garbage collection resumes after %s", cursor.describe())
                    report = GcReport(safe_point=cursor.safe_point, resumed_from=cursor.describe())
                    return _Pass(
                        cursor.safe_point,
                        report,
                        state.collected_below,
                        resumed=cursor,
                        cursor_raw=raw,
                    )
                log.warning(
                    "garbage collection drops a cursor above the state row's safe point %d "
                    "(was the row reset?): %s",
                    state.safe_point,
                    cursor.describe(),
                )
            # Obsolete (a pass at or above its safe point finished) or unusable.
            if self._store.delete_system(GC_TABLE, CURSOR_KEY, raw).applied:
                return None
        raise StoreError("could not read the garbage-collection cursor row: contention")

    def _save_cursor(self, run: _Pass, table: str, cell: Cell) -> None:
        """Record that every cell up to ``cell`` of ``table`` is swept. Never moves the
        row backwards: a cursor of a higher safe point, or one further at this safe
        point, stays (each one's claim is true of the passes that wrote it)."""
        new = GcCursor(run.safe_point, table, cell.row, cell.column)
        encoded = new.encode()
        try:
            for _ in range(20):
                if not run.cursor_known:
                    run.cursor_raw = self._store.get_system(GC_TABLE, [CURSOR_KEY]).get(CURSOR_KEY)
                    run.cursor_known = True
                current = _decoded(run.cursor_raw)
                if current is not None and current.ahead_of(new):
                    return
                result = self._store.compare_and_set(GC_TABLE, CURSOR_KEY, run.cursor_raw, encoded)
                run.cursor_raw = result.current
                if result.applied:
                    return
            log.warning("could not save the garbage-collection cursor: contention")
        except StoreError as exc:
            # Progress not saved costs a resumed pass more work, never safety.
            run.cursor_known = False
            log.warning("could not save the garbage-collection cursor: %s", exc)

    def _clear_cursor(self, run: _Pass) -> None:
        """The pass swept everything below its safe point: a cursor at or below it is
        done with (one above it belongs to a newer pass and stays)."""
        try:
            raw = self._store.get_system(GC_TABLE, [CURSOR_KEY]).get(CURSOR_KEY)
            for _ in range(20):
                current = _decoded(raw)
                if raw is None or (current is not None and current.safe_point > run.safe_point):
                    return
                result = self._store.delete_system(GC_TABLE, CURSOR_KEY, raw)
                if result.applied:
                    return
                raw = result.current
            log.warning("could not clear the garbage-collection cursor: contention")
        except StoreError as exc:
            # A cursor left behind is obsolete once a pass raised collected_below past
            # it, or resumed again at no cost to safety.
            log.warning("could not clear the garbage-collection cursor: %s", exc)

    # --- sweeping -------------------------------------------------------------------

    def _sweep_table(self, run: _Pass, table: str) -> None:
        start_row, start_column = b"", b""
        if run.resumed is not None and table == run.resumed.table:
            # Right after the cursor's cell: column + b"\x00" is the least key above it.
            start_row, start_column = run.resumed.row, run.resumed.column + b"\x00"
        page: list[Cell] = []
        # Only the cells with work below the safe point (SQLite filters them where the
        # data is): a cell whose one version below it is a value stamped below
        # ``collected_below`` has nothing to delete, stamp or collect (``_decide``).
        for cell in self._store.sweep_candidates(
            table,
            run.safe_point,
            run.collected_below,
            start_row=start_row,
            start_column=start_column,
            page_size=self._page_cells,
        ):
            page.append(cell)
            if len(page) >= self._page_cells:
                self._sweep_page(run, table, page)
                page = []
        if page:
            self._sweep_page(run, table, page)

    def _sweep_page(self, run: _Pass, table: str, page: list[Cell]) -> None:
        self._sweep_cells(run, table, page)
        # Saved only once the whole page is stamped and deleted.
        if self._monotonic() - run.saved_at >= self._cursor_every_s:
            self._save_cursor(run, table, page[-1])
            run.saved_at = self._monotonic()

    def _sweep_cells(self, run: _Pass, table: str, cells: list[Cell]) -> None:
        found = self._store.get_versions(table, cells, below_ts=run.safe_point)
        run.report.cells += len(cells)
        where = {v.ts: (table, cell) for cell, versions in found.items() for v in versions}
        unstamped = {v.ts for versions in found.values() for v in versions if v.commit_ts is None}
        outcomes = (
            self._resolver.resolve(unstamped, where={ts: where[ts] for ts in unstamped})
            if unstamped
            else {}
        )
        stamps: list[VersionStamp] = []
        doomed: list[tuple[bytes, bytes, int]] = []
        last: list[tuple[bytes, bytes, int]] = []  # deletes kept below sp: after the rest
        for cell, versions in found.items():
            _decide(run, cell, versions, outcomes, stamps, doomed, last)
        # Stamps first (a kept version carries its outcome before any entry goes), then
        # the older versions, then the kept deletes: a reader never sees an older value
        # come back from under a delete that went first. Consecutive doomed versions of
        # a cell go as one range (one range tombstone on Cassandra); a range holding a
        # kept delete goes with the kept deletes, last, and removes its versions at once.
        if stamps:
            self._store.stamp_versions(table, stamps)
            run.report.versions_stamped += len(stamps)
        run.emptied += _emptied(found, set(doomed) | set(last))
        first, then = _ranges(found, set(doomed), set(last))
        for ranges, count in (first, then):
            if ranges:
                self._store.delete_version_ranges(table, ranges)
                run.report.versions_deleted += count
                self._throttle(count)

    def _collect_entries(self, run: _Pass) -> None:
        expected = [(txn_key(ts), encode_outcome(c)) for ts, c in sorted(run.committed.items())]
        expected += [(txn_key(ts), OWN_ABORTED_VALUE) for ts in sorted(run.aborted)]
        for first in range(0, len(expected), ENTRY_DELETES_PER_CALL):
            self._check_stopping()
            chunk = expected[first : first + ENTRY_DELETES_PER_CALL]
            run.report.entries_deleted += sum(self._store.delete_system_many(TXN_TABLE, chunk))

    def _prune_due(self, table: str) -> bool:
        """Whether this collector last pruned ``table`` ``prune_every_s`` ago or never:
        a prune reads the table's whole index on Cassandra, so a loop of passes every
        few seconds prunes now and then (pruning less only leaves dead cells longer)."""
        now = self._monotonic()
        if now - self._pruned_at.get(table, now - self._prune_every_s) < self._prune_every_s:
            return False
        self._pruned_at[table] = now
        return True

    def _throttle(self, versions: int) -> None:
        if self._rate is not None:
            self._wait(versions / self._rate)

    def stop(self) -> None:
        """Stop the pass running now at its next wait or table (``GcStoppedError``), and
        every later one at its start. Safe at any point: a pass deletes nothing before
        its grace has passed, and the next pass resumes from the cursor or raises the
        safe point again, waiting what is left of the grace (rule S8)."""
        self._stopping.set()

    def _wait(self, seconds: float) -> None:
        self._sleep(seconds)
        self._check_stopping()

    def _check_stopping(self) -> None:
        if self._stopping.is_set():
            raise GcStoppedError("garbage collection stopped (the server is stopping)")


def _decide(
    run: _Pass,
    cell: Cell,
    versions: list[Version],
    outcomes: dict[int, int],
    stamps: list[VersionStamp],
    doomed: list[tuple[bytes, bytes, int]],
    last: list[tuple[bytes, bytes, int]],
) -> None:
    """Sort a cell's versions below the safe point (newest first): stamps to write,
    versions to delete, and the kept delete to remove last."""
    kept = False
    for v in versions:  # newest first, all below the safe point
        outcome = v.commit_ts if v.commit_ts is not None else outcomes.get(v.ts, ABORTED)
        key = (cell.row, cell.column, v.ts)
        if outcome < 0:  # ABORTED, or GONE (deleted meanwhile)
            if outcome == ABORTED:
                doomed.append(key)
                run.aborted.add(v.ts)
            continue
        stamp = VersionStamp(cell.row, cell.column, v.ts, outcome)
        if outcome >= run.safe_point:
            # Visible only above the safe point: kept, stamped, its entry kept.
            if v.commit_ts is None:
                stamps.append(stamp)
            continue
        if v.commit_ts is None or outcome >= run.collected_below:
            # (Stamped and below a finished pass's safe point: that pass deleted
            # the entry already.)
            run.committed[v.ts] = outcome
        if kept:
            doomed.append(key)  # hidden below the safe point by a newer commit
            continue
        kept = True
        if v.value is None:  # a delete below the safe point hides nothing left
            last.append(key)
        elif v.commit_ts is None:
            stamps.append(stamp)


def _prune(store: KVStore, table: str, run: _Pass, full: bool) -> int:
    """Cells left with no version stop costing scans (a no-op but on Cassandra): the
    whole index when ``full`` (now and then: it reads every index row), else around the
    cells this pass emptied. Below the safe point, after its grace: no writer that may
    commit writes there any more (S8), which is what a prune needs (KVStore.prune_cells)."""
    if full:
        return store.prune_cells(table, run.safe_point)
    return store.prune_emptied_cells(table, run.safe_point, run.emptied) if run.emptied else 0


def _emptied(
    found: dict[Cell, list[Version]], removable: set[tuple[bytes, bytes, int]]
) -> list[Cell]:
    """The cells of ``found`` whose every version (below the safe point) is removable."""
    return [
        cell
        for cell, versions in found.items()
        if versions and all((cell.row, cell.column, v.ts) in removable for v in versions)
    ]


_Ranges = tuple[list[tuple[bytes, bytes, int, int]], int]


def _ranges(
    found: dict[Cell, list[Version]],
    doomed: set[tuple[bytes, bytes, int]],
    last: set[tuple[bytes, bytes, int]],
) -> tuple[_Ranges, _Ranges]:
    """The doomed versions as ``(row, column, low_ts, high_ts)`` ranges of consecutive
    versions of a cell (as read, newest first): those to delete first, and those holding
    a kept delete (``last``), each with the number of versions they hold.

    A range covers only versions the pass read and doomed, and the gaps between them,
    all below the safe point: a version written into a gap later is one no reader needs
    (S8: its writer started below the safe point and never commits), so the range may
    take it too (``KVStore.delete_version_ranges``).
    """
    first: list[tuple[bytes, bytes, int, int]] = []
    then: list[tuple[bytes, bytes, int, int]] = []
    counts = [0, 0]
    removable = doomed | last
    for cell, versions in found.items():
        for run in _runs(cell, versions, removable):
            holds_last = any((cell.row, cell.column, ts) in last for ts in run)
            (then if holds_last else first).append((cell.row, cell.column, run[-1], run[0]))
            counts[holds_last] += len(run)
    return (first, counts[0]), (then, counts[1])


def _runs(
    cell: Cell, versions: list[Version], doomed: set[tuple[bytes, bytes, int]]
) -> list[list[int]]:
    """The timestamps of each run of consecutive doomed versions, newest first."""
    runs: list[list[int]] = [[]]
    for v in versions:
        if (cell.row, cell.column, v.ts) in doomed:
            runs[-1].append(v.ts)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _decoded(raw: bytes | None) -> GcCursor | None:
    """The cursor in ``raw``; None if absent, or corrupt (then overwritten)."""
    if raw is None:
        return None
    try:
        return GcCursor.decode(raw)
    except StoreError:
        return None


def _thin(samples: list[tuple[int, int]], horizon_ms: int) -> list[tuple[int, int]]:
    """Samples worth keeping: the newest one at or before ``horizon_ms`` and every later
    one, at most :data:`MAX_SAMPLES` (every other one of the oldest half dropped)."""
    older = [s for s in samples if s[0] <= horizon_ms]
    kept = older[-1:] + [s for s in samples if s[0] > horizon_ms]
    while len(kept) > MAX_SAMPLES:
        half = len(kept) // 2
        kept = kept[:half:2] + kept[half:]
    return kept


class GcLoop:
    """Runs a pass every ``interval_s`` on a daemon thread until :meth:`close`
    (``percolake serve --gc-interval-s``). A failed pass is logged and resumed at the
    next interval from its cursor: every step of a pass is idempotent."""

    def __init__(self, collector: GarbageCollector, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._collector = collector
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.passes = 0
        self.last: GcReport | None = None
        self._thread = threading.Thread(target=self._run, name="percolake-gc", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.last = self._collector.run_once()
                self.passes += 1
            except GcStoppedError:
                log.info("garbage collection stopped in a pass; the next start resumes it")
                return
            except Exception:
                metrics.record_gc_pass_failed()
                log.exception("garbage-collection pass failed; the next one retries")

    def close(self) -> None:
        """Stop: a pass in progress ends at its next wait or table, not after its grace."""
        self._stop.set()
        self._collector.stop()
        self._thread.join(timeout=60)
