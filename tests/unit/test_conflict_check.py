"""Write-write conflict checks on cells with long version histories (paging)."""

from __future__ import annotations

import pytest

from storage_adapters import VersionWrite
from txn import TransactionManager
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
