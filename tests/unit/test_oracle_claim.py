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
import subprocess
import sys
from pathlib import Path

import pytest

from lockserver import LockTable
from storage_adapters import open_store
from tso import BOUND_KEY, TSO_TABLE, OracleAlreadyRunningError, TimestampBatcher, TimestampOracle
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


# --- one claim per database file, whatever path reaches it (issue 30, item 12) ---------


def test_a_second_oracle_reaching_the_database_through_a_symlink_fails_fast(
    tmp_path: Path,
) -> None:
    """Fails before the fix: the claim's lock file was named from the path as given
    (``abspath``), so an oracle opening ``link.db -> store.db`` locked
    ``link.db.oracle.lock`` and held "its" claim too. The leader row said ``claimed``
    and its claim was held, which the lease took as proof that the first oracle was
    gone: it took over at once (0.01 s), moved the bound and served 1,000,001 while the
    first, alive, still served 2, 3, ... from its window (S7: timestamps went backwards
    in real time). Now the claim is a lock on the database file itself, and the second
    oracle refuses before it touches the bound."""
    os.symlink(tmp_path / "store.db", tmp_path / "link.db")
    first = TimestampOracle(open_store(_url(tmp_path)))
    served = [first.next_timestamp()]
    for path in ("link.db", "dir-link/store.db"):
        if path.startswith("dir-link"):
            os.symlink(tmp_path, tmp_path / "dir-link")
        other = open_store(f"sqlite:///{tmp_path}/{path}")
        bound_before = other.get_system(TSO_TABLE, [BOUND_KEY])
        with pytest.raises(OracleAlreadyRunningError, match="another timestamp oracle"):
            TimestampOracle(other)
        assert other.get_system(TSO_TABLE, [BOUND_KEY]) == bound_before  # not moved
        other.close()
        served.append(first.next_timestamp())  # the first is not fenced
    assert served == sorted(served) and len(set(served)) == len(served)


_HOLD_AN_ORACLE = """
import sys
from storage_adapters import open_store
from tso import TimestampOracle
oracle = TimestampOracle(open_store(sys.argv[1]))
print(oracle.next_timestamp(), flush=True)
sys.stdin.readline()
print(oracle.next_timestamp(), flush=True)
"""


def test_a_second_oracle_reaching_the_database_through_a_hard_link_fails_fast(
    tmp_path: Path,
) -> None:
    """Fails before the fix, as through a symlink: a hard link ``other/store.db`` in
    another folder named a different lock file. It needs two processes: SQLite itself
    cannot open one file by two names in one process. The first process holds an
    embedded oracle and serves; this one, through the hard link, must refuse, and the
    first one's next timestamp is above its earlier one (it was not fenced)."""
    open_store(_url(tmp_path)).close()
    (tmp_path / "other").mkdir()
    os.link(tmp_path / "store.db", tmp_path / "other" / "store.db")
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD_AN_ORACLE, _url(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdin is not None
            first = int(holder.stdout.readline())
            other = open_store(f"sqlite:///{tmp_path}/other/store.db")
            with pytest.raises(OracleAlreadyRunningError, match="the database file"):
                TimestampOracle(other)
            other.close()
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert int(holder.stdout.readline()) == first + 1
        finally:
            holder.kill()
