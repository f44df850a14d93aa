"""How every catalog operation reaches a table's cells: the retry loop, the turn at the
head, and the reads each operation starts with.

Every change to a table is one percolake transaction that writes the table's head
cell (see ``model`` for the layout). Two changes of one table therefore always
conflict on the head (first committer wins), and the loser retries on a fresh
snapshot (:meth:`TableAccess.transact`). Commits (``commit``), history
(``history``), expiry (``expiry``) and vacuum's fence all go through one
:class:`TableAccess` that the :class:`~spark_integration.engine.catalog.Catalog`
owns, so they share its clock, its failure points and its cache of table metadata.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.errors import (
    ConcurrentModificationError,
    LakehouseError,
    TableNotFoundError,
    VersionNotFoundError,
)
from spark_integration.engine.model import FileEntry, Generation, Head, Layout, TableMeta
from spark_integration.engine.retention import describe_s, read_expiry, read_retention
from txn import (
    Manager,
    RetriesExhaustedError,
    RetryPolicy,
    Transaction,
    TransactionStatus,
    run_transaction,
)

T = TypeVar("T")

#: Backoff between attempts at the head: full jitter, doubling from the base up to
#: the cap. The cap stays small because a conflicting append only lost a race for
#: one cell; long sleeps would only leave the head idle.
RETRY_BASE_S = 0.002
RETRY_CAP_S = 0.05


class TableAccess:
    """One catalog's way into its tables' cells, over one transaction manager. Thread-safe."""

    def __init__(
        self,
        tm: Manager,
        layout: Layout,
        *,
        commit_timeout_s: float,
        failpoints: fp.FailPoints,
        clock_ms: Callable[[], int],
    ) -> None:
        self.tm = tm
        self.layout = layout
        self.commit_timeout_s = commit_timeout_s
        #: Tests only; the points from ``fp.SETTLE_COMMIT`` on are hit here.
        self.failpoints = failpoints
        #: This process's wall clock in ms (tests inject skewed ones): log times,
        #: creation times and the "not in the future" check of time travel.
        self.clock_ms = clock_ms
        # Table metadata never changes once created, and tables are never dropped.
        self._meta: dict[str, TableMeta] = {}
        self._head_locks: dict[str, threading.Lock] = {}
        self._head_locks_guard = threading.Lock()

    # --- the retry loop ---------------------------------------------------------------

    @contextlib.contextmanager
    def head_turn(self, name: str) -> Iterator[None]:
        """Writers of one table's head in this process (commits, expiry's publish,
        time-travel fences) take turns at it.

        Only one of them could win a given version anyway; the others would each
        write, conflict, clean up and retry. Queueing here costs nothing in
        safety (other processes still race through the transaction protocol) and
        keeps eight threads of one process near one thread's throughput.
        """
        with self._head_locks_guard:
            lock = self._head_locks.setdefault(name, threading.Lock())
        if not lock.acquire(timeout=self.commit_timeout_s):
            raise ConcurrentModificationError(
                f"commit to table {name!r} waited {self.commit_timeout_s:.0f} s for its "
                "turn behind other commits of this process; nothing was committed"
            )
        try:
            yield
        finally:
            lock.release()

    def transact(
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
            deadline_s=self.commit_timeout_s,
            base_s=RETRY_BASE_S,
            cap_s=RETRY_CAP_S,
            settle_unknown=settle_unknown or job_id is not None,
            give_up_on=(ConcurrentModificationError,),
            # The fixed window: this engine serves every table from one process (the
            # gateway), whose conflict rate must not pace one table for another's
            # contention; the deadline, not a count of attempts, bounds the retries.
            adaptive=False,
        )

        def outcome(txn_id: str, *, settle: bool = False) -> TransactionStatus | None:
            if job_id is not None:
                self.failpoints.hit(fp.SETTLE_COMMIT, job_id)
            return self.tm.outcome(txn_id, settle=settle)

        try:
            return run_transaction(self.tm.begin, outcome, fn, policy, what=what)
        except RetriesExhaustedError as exc:
            # Only the head row is contended: other commits of this table kept
            # winning the race. Nothing of ours is visible.
            raise ConcurrentModificationError(
                f"{what}: lost the race for the table's head {exc.attempts} times in "
                f"{self.commit_timeout_s:.0f} s; nothing was committed"
            ) from exc

    # --- reads ------------------------------------------------------------------------

    def read_head(self, tx: Transaction, name: str) -> Head:
        return self._head(name, tx.get(self.layout.head, Layout.name_row(name), Layout.COL_HEAD))

    def read_head_with(
        self, tx: Transaction, name: str, table: str, cells: list[tuple[bytes, bytes]]
    ) -> tuple[Head, dict[tuple[bytes, bytes], bytes]]:
        """The head, and ``cells`` of ``table`` (``get_many``), read together in one
        round trip at the transaction's snapshot: a group commit's head and job marks."""
        head_cell = (Layout.name_row(name), Layout.COL_HEAD)
        head, found = tx.get_many_of_tables([(self.layout.head, [head_cell]), (table, cells)])
        return self._head(name, head.get(head_cell)), found

    def _head(self, name: str, raw: bytes | None) -> Head:
        if raw is None:
            raise TableNotFoundError(f"no table {name!r} in catalog {self.layout.catalog!r}")
        return Head.decode(raw)

    def cached_meta(self, name: str) -> TableMeta | None:
        return self._meta.get(name)

    def read_meta(self, tx: Transaction, name: str, head: Head | None = None) -> TableMeta:
        """The table's metadata; cached until ``head`` shows a newer schema or table."""
        cached = self._meta.get(name)
        if cached is not None and (
            head is None
            or (
                cached.schema_since == head.schema_version
                and head.created_ms in (0, cached.created_ms)
            )
        ):
            return cached
        raw = tx.get(self.layout.tables, Layout.name_row(name), Layout.COL_META)
        if raw is None:
            raise TableNotFoundError(f"no table {name!r} in catalog {self.layout.catalog!r}")
        meta = TableMeta.decode(raw)
        self._meta[name] = meta
        return meta

    def forget_meta(self, name: str) -> None:
        """Drop the cached metadata (a schema change rewrote it, or the table went)."""
        self._meta.pop(name, None)

    def read_mark(self, tx: Transaction, name: str, app_id: str, batch_id: int | str) -> int | None:
        raw = tx.get(self.layout.marks, Layout.mark_row(name, app_id, batch_id), Layout.COL_MARK)
        return None if raw is None else int(raw)

    def generations(self, tx: Transaction, name: str) -> list[Generation]:
        return [
            Generation.decode(value)
            for _, _, value in tx.scan(
                self.layout.gens, Layout.prefix(name), Layout.prefix_end(name)
            )
        ]

    def gen_of(self, tx: Transaction, name: str, version: int) -> tuple[int, int]:
        """The generation ``version`` belongs to, and that generation's first version."""
        gen, start = 0, 0
        for g in self.generations(tx, name):
            if g.start_version > version:
                break
            gen, start = g.gen, g.start_version
        return gen, start

    def read_generation(self, tx: Transaction, name: str, gen: int) -> Generation:
        """Generation ``gen`` of the table; ``LakehouseError`` if its row is missing."""
        raw = tx.get(self.layout.gens, Layout.gen_row(name, gen), Layout.COL_GEN)
        if raw is None:
            raise LakehouseError(f"table {name!r} has no record of its generation {gen}")
        return Generation.decode(raw)

    def scan_files(
        self, tx: Transaction, name: str, start: bytes, end: bytes
    ) -> Iterator[tuple[tuple[int, int, int], FileEntry]]:
        """The files added by the file rows in ``[start, end)`` (removal rows left out)."""
        for key, removal, entry in self.scan_rows(tx, name, start, end):
            if not removal:
                yield key, entry

    def scan_rows(
        self, tx: Transaction, name: str, start: bytes, end: bytes
    ) -> Iterator[tuple[tuple[int, int, int], bool, FileEntry]]:
        """Every file row in ``[start, end)``: ``((gen, version, index), is a removal
        row, the file it added or removed)``."""
        for row, column, value in tx.scan(self.layout.files, start, end):
            yield (
                Layout.parse_file_row(name, row),
                column == Layout.COL_REMOVE,
                FileEntry.decode(value),
            )

    def check_readable(self, tx: Transaction, name: str, head: Head, version: int) -> None:
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
