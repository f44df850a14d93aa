"""Write-write conflict checks on cells with long version histories (paging)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from lockserver import LockTable
from storage_adapters import Cell, VersionWrite
from storage_adapters.memory import MemoryStore
from tso import TimestampBatcher, TimestampOracle
from txn import COMMIT_STEPS, Transaction, TransactionConfig, TransactionManager
from txn.errors import TransactionConflictError
from txn.tables import ABORTED, TXN_TABLE, encode_outcome, txn_key

pytestmark = pytest.mark.unit


def _history(tm: TransactionManager, outcomes: dict[int, int]) -> None:
    """Versions of cell t/r/c written by the given writers, with their outcomes."""
    tm.store.put_versions("t", [VersionWrite(b"r", b"c", ts, b"x") for ts in outcomes])
    for ts, outcome in outcomes.items():
        tm.store.put_unless_exists(TXN_TABLE, txn_key(ts), encode_outcome(outcome))


def _writer_after(tm: TransactionManager, n: int):  # type: ignore[no-untyped-def]
    for _ in range(n):
        tm.begin()  # move the oracle on, so that older writers fit below
    tx = tm.begin()
    tx.put("t", b"r", b"c", b"mine")
    return tx


def test_a_conflict_deep_below_many_aborted_writers_is_found() -> None:
    with TransactionManager.embedded("memory://") as tm:
        tx = _writer_after(tm, 200)
        outcomes = {ts: ABORTED for ts in range(20, 80)}
        outcomes[10] = tx.start_ts + 5  # started before us, committed after we started
        _history(tm, outcomes)
        with pytest.raises(TransactionConflictError, match="committed at"):
            tx.commit()


def test_a_committed_writer_deep_above_many_aborted_ones_is_found() -> None:
    with TransactionManager.embedded("memory://") as tm:
        tx = _writer_after(tm, 0)
        base = tx.start_ts + 10_000
        outcomes = {base + i: ABORTED for i in range(1, 40)}
        outcomes[base] = base + 100  # started after us and committed
        _history(tm, outcomes)
        with pytest.raises(TransactionConflictError, match="started after"):
            tx.commit()


def test_a_long_history_of_aborted_and_old_commits_is_no_conflict() -> None:
    with TransactionManager.embedded("memory://") as tm:
        tx = _writer_after(tm, 200)
        outcomes = {ts: ABORTED for ts in range(20, 80)}
        outcomes[10] = 15  # committed long before we started
        outcomes.update({tx.start_ts + 10_000 + i: ABORTED for i in range(30)})
        _history(tm, outcomes)
        assert tx.commit() > tx.start_ts


class _ReadBackHook(MemoryStore):
    """A memory store that runs ``between`` once inside a write step's read-back: after
    the versions landed and before they are read back, or, ``read_first`` (the broken
    build), after the read and before the write."""

    def __init__(self, *, read_first: bool) -> None:
        super().__init__()
        self.read_first = read_first
        self.between: Callable[[], None] | None = None

    def put_versions_read_back_of_tables(
        self, writes: Sequence[tuple[str, Sequence[VersionWrite]]], *, limit: int | None = None
    ) -> list[dict[Cell, list[int]]]:
        hook, self.between = self.between, None
        cells = [(table, [(v.row, v.column) for v in versions]) for table, versions in writes]
        if self.read_first:
            pages = self.get_version_timestamps_of_tables(cells, limit=limit)
        else:
            self.put_versions_of_tables(writes)
        if hook is not None:
            hook()
        if self.read_first:
            self.put_versions_of_tables(writes)
            return pages
        return self.get_version_timestamps_of_tables(cells, limit=limit)


def _overlapping_writers_that_commit(*, read_first: bool) -> list[str]:
    """Two writers of one cell, without locks (rule S5: safety must not need them); the
    second commits whole inside the first's write step. Which of them committed."""
    store = _ReadBackHook(read_first=read_first)
    config = TransactionConfig(resolve_wait_ms=50, settle_backoff_ms=1)
    no_locks = tuple(step for step in COMMIT_STEPS if step != "lock")
    tm = TransactionManager(
        store,
        TimestampBatcher(TimestampOracle(store).next_range),
        LockTable(),
        config,
        commit_steps=no_locks,
    )
    committed: list[str] = []

    def commit(name: str, tx: Transaction) -> None:
        try:
            tx.commit()
            committed.append(name)
        except TransactionConflictError:
            pass

    try:
        first, second = tm.begin(), tm.begin()
        first.put("t", b"r", b"c", b"first")
        second.put("t", b"r", b"c", b"second")
        store.between = lambda: commit("second", second)
        commit("first", first)
    finally:
        tm.close()
    return sorted(committed)


def test_the_conflict_check_reads_back_after_its_own_write_landed() -> None:
    """The write step reads back each cell after its version landed (S2, per cell): the
    second writer's check sees the first one's version and settles it, and the first
    one's read-back sees the second's commit. One of the two commits."""
    assert _overlapping_writers_that_commit(read_first=False) == ["second"]


def test_a_read_back_taken_before_the_write_is_caught() -> None:
    """The broken build: the first page read before the version was written. Each
    writer misses the other and both commit, a lost update (G0)."""
    assert _overlapping_writers_that_commit(read_first=True) == ["first", "second"]
