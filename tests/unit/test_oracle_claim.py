"""One timestamp oracle per SQLite store (rule S7), in one process: a second one fails fast.

Before the fix, an oracle took the persisted bound with compare-and-set and then served
from its in-memory window (up to 1,000,000 timestamps) until its next extension. A
second oracle on the same store took the next window and served too, so two oracles
handed out interleaved timestamps: the old one ``1, 2, 3, ...``, the new one
``1000001, 1000002, ...``. A writer that takes its timestamps from the old oracle then
commits *below* the snapshot of a reader that started earlier on the new one, so the
reader sees half of that writer's transaction (read skew). Now the oracle holds an
exclusive claim on the store (an OS file lock next to the SQLite file) for as long as
it lives, and a second one refuses to start, naming the lock file and the pid holding it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lockserver import LockTable
from storage_adapters import open_store
from tso import BOUND_KEY, TSO_TABLE, TimestampBatcher, TimestampOracle
from tso._oracle import OracleAlreadyRunningError
from txn import TransactionManager

pytestmark = pytest.mark.unit


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


def _lock_file(tmp_path: Path) -> str:
    return f"{tmp_path}/store.db.oracle.lock"


def test_a_second_embedded_manager_on_one_sqlite_file_fails_fast(tmp_path: Path) -> None:
    """Fails before the fix: the second ``embedded`` started and served its own window.

    Interleaving it allowed: ``first`` serves 1, 2, ...; ``second`` moves the bound and
    serves 1000001, ...; ``first`` keeps serving 3, 4, ... until its window runs out.
    """
    first = TransactionManager.embedded(_url(tmp_path))
    try:
        with first.begin() as tx:
            tx.put("t", b"r", b"c", b"v")
        with pytest.raises(OracleAlreadyRunningError) as refused:
            TransactionManager.embedded(_url(tmp_path))
        message = str(refused.value)
        assert _lock_file(tmp_path) in message
        assert f"pid {os.getpid()}" in message
        with first.begin() as tx:  # the first one is not disturbed
            assert tx.get("t", b"r", b"c") == b"v"
    finally:
        first.close()
    after_close = TransactionManager.embedded(_url(tmp_path))  # close released the claim
    with after_close, after_close.begin() as tx:
        assert tx.get("t", b"r", b"c") == b"v"


def test_two_overlapping_oracles_on_one_sqlite_store_cannot_both_hand_out_timestamps(
    tmp_path: Path,
) -> None:
    """Fails before the fix: both oracles handed out timestamps, interleaved.

    Before: ``old`` took the window [1, 1000001) and ``new`` the window
    [1000001, 2000001); then ``old`` served 2 after ``new`` had served 1000001, so
    timestamps went backwards in real time. Now ``new`` refuses before it touches the
    bound, and ``old`` keeps serving above everything it served.
    """
    old = TimestampOracle(open_store(_url(tmp_path)))
    served = [old.next_timestamp()]
    other_handle = open_store(_url(tmp_path))
    bound_before = other_handle.get_system(TSO_TABLE, [BOUND_KEY])
    with pytest.raises(OracleAlreadyRunningError):
        TimestampOracle(other_handle)
    assert other_handle.get_system(TSO_TABLE, [BOUND_KEY]) == bound_before  # not fenced
    served += [old.next_timestamp() for _ in range(3)]
    assert served == sorted(served) and len(set(served)) == len(served)
    other_handle.close()


def _unclaimed_manager(tmp_path: Path) -> TransactionManager:
    """An embedded manager whose oracle does not claim the store (the unsafe build)."""
    store = open_store(_url(tmp_path))
    oracle = TimestampOracle(store, claim_store=False)
    return TransactionManager(
        store, TimestampBatcher(oracle.next_range), LockTable(), owns=(store,)
    )


def test_without_the_claim_two_embedded_managers_produce_read_skew(tmp_path: Path) -> None:
    """Why the claim exists: the same interleaving with the claim switched off.

    The reader begins on ``new`` (start_ts 1000001+) and reads ``x``: absent. A writer
    on ``old`` then begins (start_ts 2), writes ``x`` and ``y`` and commits with
    commit_ts 3, below the reader's snapshot. The reader reads ``y`` and sees the
    writer's value: half of one transaction (read skew, G-single).
    """
    old, new = _unclaimed_manager(tmp_path), _unclaimed_manager(tmp_path)
    try:
        reader = new.begin()
        assert reader.get("t", b"x", b"c") is None
        with old.begin() as writer:
            writer.put("t", b"x", b"c", b"1")
            writer.put("t", b"y", b"c", b"1")
        assert writer.commit_ts is not None
        assert writer.commit_ts < reader.start_ts  # committed in the reader's past
        assert reader.get("t", b"y", b"c") == b"1"  # y from the writer, x not: read skew
        reader.abort()
    finally:
        new.close()
        old.close()
