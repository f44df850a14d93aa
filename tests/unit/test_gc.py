"""Garbage collection (issue 17, rules S8 and S9) on the embedded stores: what a pass
keeps, stamps and deletes, the safe point's lease, registrations, and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_adapters import MAX_TIMESTAMP, Cell, KVStore, VersionWrite, open_store
from txn import GarbageCollector, TransactionConfig, TransactionManager
from txn import failpoints as fp
from txn.errors import SnapshotTooOldError, TransactionAbortedError, TransactionConflictError
from txn.tables import (
    ABORTED,
    GC_TABLE,
    OWN_ABORTED_VALUE,
    STATE_KEY,
    TXN_TABLE,
    GcState,
    decode_outcome,
    encode_outcome,
    read_state,
    txn_key,
)

pytestmark = pytest.mark.unit

HOT = Cell(b"hot", b"c")


@pytest.fixture(params=["memory", "sqlite"])
def tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/gc.db"
    manager = TransactionManager.embedded(
        url, config=TransactionConfig(resolve_wait_ms=0, gc_publish_interval_ms=10**9)
    )
    # A grace of 0 before any reader leases the state row: passes need not wait.
    manager.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
    yield manager
    manager.close()


def _collector(tm: TransactionManager, **kw: object) -> GarbageCollector:
    args: dict[str, object] = {"retention_s": 0, "grace_ms": 0, **kw}
    return GarbageCollector(tm.store, timestamps=tm._rt.timestamps, locks=tm.locks, **args)  # type: ignore[arg-type]


def _entries(store: KVStore, start_tss: list[int]) -> dict[int, int]:
    rows = store.get_system(TXN_TABLE, [txn_key(ts) for ts in start_tss])
    return {ts: decode_outcome(rows[txn_key(ts)]) for ts in start_tss if txn_key(ts) in rows}


def _commit(tm: TransactionManager, cell: Cell, value: bytes | None) -> int:
    tx = tm.begin()
    if value is None:
        tx.delete("t", cell.row, cell.column)
    else:
        tx.put("t", cell.row, cell.column, value)
    tx.commit()
    return tx.start_ts


def test_a_pass_keeps_what_snapshots_above_the_safe_point_read(tm: TransactionManager) -> None:
    writers = [_commit(tm, HOT, b"%d" % i) for i in range(20)]
    gone = Cell(b"gone", b"c")
    writers += [_commit(tm, gone, b"x"), _commit(tm, gone, None)]
    aborted = tm.begin()
    aborted.put("t", HOT.row, HOT.column, b"never")
    commit = aborted.committer()
    commit.step()  # lock
    commit.step()  # write: a version of a writer that never reaches its commit point
    before = tm.begin()
    assert before.get("t", HOT.row, HOT.column) == b"19"

    report = _collector(tm).run_once()

    assert report.safe_point > max(writers)
    versions = tm.store.get_versions("t", [HOT, gone])
    # The newest committed value stays, stamped; the older ones, the aborted writer's
    # version and the deleted cell's versions are gone.
    assert versions == {HOT: [versions[HOT][0]]}
    assert versions[HOT][0].value == b"19" and versions[HOT][0].commit_ts is not None
    # (The stalled writer's version may have gone already: the read above settled it
    # ABORTED and queued it for the cleaner.)
    assert report.versions_deleted in (19 + 2, 19 + 2 + 1)
    # Entries of writers committed below the safe point are gone; the ABORTED that
    # collection wrote for the stalled writer stays (it fences that writer).
    assert _entries(tm.store, writers) == {}
    assert _entries(tm.store, [aborted.start_ts]) == {aborted.start_ts: ABORTED}
    with pytest.raises(TransactionAbortedError):  # below the safe point, and fenced
        commit.run()
    fresh = tm.begin()
    assert fresh.get("t", HOT.row, HOT.column) == b"19"
    assert fresh.get("t", gone.row, gone.column) is None
    assert list(fresh.scan("t")) == [(HOT.row, HOT.column, b"19")]
    # The old snapshot now reads below the safe point: refused, not answered wrongly.
    with pytest.raises(SnapshotTooOldError, match="safe point"):
        before.get("t", HOT.row, HOT.column)
    # A second pass finds nothing more to do.
    again = _collector(tm).run_once()
    assert (again.versions_deleted, again.versions_stamped) == (0, 0)


def test_a_transaction_below_the_safe_point_cannot_commit(tm: TransactionManager) -> None:
    _commit(tm, HOT, b"a")
    old = tm.begin()
    old.put("t", b"other", b"c", b"late")
    _collector(tm).run_once()
    with pytest.raises(SnapshotTooOldError):
        old.commit()
    assert tm.begin().get("t", b"other", b"c") is None


def test_a_registered_long_running_transaction_keeps_its_snapshot(
    tm: TransactionManager,
) -> None:
    _commit(tm, HOT, b"a")
    long_running = tm.begin()
    registration = tm._rt.registration
    registration.tick()  # it is open at this publication ...
    registration.tick()  # ... and still at the next: published as long-running
    _commit(tm, HOT, b"b")
    report = _collector(tm).run_once()
    assert report.safe_point == long_running.start_ts
    assert long_running.get("t", HOT.row, HOT.column) == b"a"
    long_running.commit()
    registration.tick()  # nothing open any more
    assert _collector(tm).run_once().safe_point > long_running.start_ts


def test_retention_without_an_old_enough_sample_collects_nothing(
    tm: TransactionManager,
) -> None:
    _commit(tm, HOT, b"a")
    _commit(tm, HOT, b"b")
    report = _collector(tm, retention_s=600).run_once()
    assert report.safe_point == 0 and "600 s old" in report.note
    assert len(tm.store.get_versions("t", [HOT])[HOT]) == 2
    assert read_state(tm.store)[0].samples  # recorded for a later pass


def test_a_writers_own_abort_entry_goes_with_its_versions(tm: TransactionManager) -> None:
    tx = tm.begin()
    tx.put("t", HOT.row, HOT.column, b"x")
    commit = tx.committer()
    commit.step()  # lock
    commit.step()  # write
    tm.failpoints.enable(
        fp.AFTER_CONFLICT_CHECK, fp.raise_error(lambda: TransactionConflictError("injected"))
    )
    with pytest.raises(Exception, match="injected"):
        commit.run()
    tm.failpoints.disable()
    tm.wait_for_cleanup()
    assert tm.store.get_versions("t", [HOT]) == {}
    assert _entries(tm.store, [tx.start_ts]) == {}
    # An ABORTED someone else wrote is never deleted by compare-and-delete of the own one.
    tm.store.put_unless_exists(TXN_TABLE, txn_key(12345), encode_outcome(ABORTED))
    assert not tm.store.delete_system(TXN_TABLE, txn_key(12345), OWN_ABORTED_VALUE).applied


def test_a_version_read_before_its_entry_was_collected_resolves_by_its_stamp(
    tm: TransactionManager,
) -> None:
    writer = _commit(tm, HOT, b"a")
    _commit(tm, Cell(b"other", b"c"), b"b")
    read_before = tm.store.get_latest("t", [HOT], MAX_TIMESTAMP)[HOT]
    assert read_before.commit_ts is None
    _collector(tm).run_once()
    assert _entries(tm.store, [writer]) == {}
    tm._rt.resolver.clear_cache()
    resolved = tm._rt.resolver.resolve([writer], where={writer: ("t", HOT)})
    assert resolved[writer] > writer  # the stamp, not ABORTED
    assert _entries(tm.store, [writer]) == {}  # and nothing was settled


def test_a_version_with_neither_entry_nor_stamp_is_settled_aborted(
    tm: TransactionManager,
) -> None:
    tm.store.put_versions("t", [VersionWrite(HOT.row, HOT.column, 7, b"orphan")])
    assert tm._rt.resolver.resolve([7], where={7: ("t", HOT)}) == {7: ABORTED}
    assert tm.begin().get("t", HOT.row, HOT.column) is None


def test_percolake_gc_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    manager = TransactionManager.embedded(url)
    for i in range(5):
        _commit(manager, HOT, b"%d" % i)
    manager.close()  # publishes its last timestamp: a sample for the retention
    store = open_store(url)
    store.compare_and_set(
        GC_TABLE,
        STATE_KEY,
        store.get_system(GC_TABLE, [STATE_KEY]).get(STATE_KEY),
        GcState(grace_ms=0).encode(),
    )
    store.close()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "percolake",
            "gc",
            "--store",
            url,
            "--retention-s",
            "0",
            "--grace-ms",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(run.stdout)
    # The safe point is the last writer's start (the newest sample): its version is not
    # below it; the fourth is the newest committed below it (kept), three go, and the
    # entries of the four writers committed below it.
    assert report["versions_deleted"] == 3 and report["entries_deleted"] == 4
    bad = subprocess.run(
        [sys.executable, "-m", "percolake", "gc", "--store", url, "--retention-s", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "retention_s must be >= 0" in bad.stderr
