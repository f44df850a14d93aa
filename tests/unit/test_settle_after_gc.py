"""Settling a writer whose transactions-table entry garbage collection may have collected
(issue 30, item 1; rules S6 and S9 in docs/design/gc.md, "Settling after collection").

A committed writer's entry is deleted once a pass stamped its versions below a safe
point it published first. From then on "no entry" no longer means "never committed",
so a settle (``Status(settle=True)``, ``outcome(txn_id, settle=True)``, the retry loop's)
must never write ABORTED for it: it finds the outcome from the commit stamps on cells
the writer wrote, or says the outcome is no longer known.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_adapters import CasResult, Cell, KVStore, VersionStamp, VersionWrite, open_store
from txn import GarbageCollector, TransactionConfig, TransactionManager, TransactionStatus
from txn._status import StatusResolver
from txn.errors import CommitUnknownError, OutcomeForgottenError, TransactionAbortedError
from txn.tables import (
    ABORTED,
    GC_TABLE,
    STATE_KEY,
    TXN_TABLE,
    GcState,
    encode_outcome,
    read_state,
    txn_key,
)

pytestmark = pytest.mark.unit

HOT = Cell(b"hot", b"c")
OTHER = Cell(b"other", b"c")


@pytest.fixture(params=["memory", "sqlite"])
def tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/settle.db"
    manager = TransactionManager.embedded(
        url, config=TransactionConfig(resolve_wait_ms=0, gc_publish_interval_ms=10**9)
    )
    manager.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
    yield manager
    manager.close()


def _collect(tm: TransactionManager) -> None:
    GarbageCollector(
        tm.store, timestamps=tm._rt.timestamps, locks=tm.locks, retention_s=0, grace_ms=0
    ).run_once()


def _commit(tm: TransactionManager, cell: Cell, value: bytes) -> tuple[int, int]:
    tx = tm.begin()
    tx.put("t", cell.row, cell.column, value)
    return tx.start_ts, tx.commit()


def _entry(store: KVStore, start_ts: int) -> bytes | None:
    return store.get_system(TXN_TABLE, [txn_key(start_ts)]).get(txn_key(start_ts))


def _collected_writer(tm: TransactionManager) -> tuple[int, int]:
    """A writer committed, stamped and its entry collected; every cache forgotten."""
    writer, commit_ts = _commit(tm, HOT, b"a")
    _commit(tm, OTHER, b"b")  # a later timestamp, so the safe point passes the writer
    _collect(tm)
    assert _entry(tm.store, writer) is None
    tm._rt.resolver.clear_cache()
    return writer, commit_ts


def test_settling_a_collected_commit_by_id_is_unknown_never_aborted(
    tm: TransactionManager,
) -> None:
    """Failed before the fix: ``outcome(txn_id, settle=True)`` found no entry, wrote
    ABORTED and answered ABORTED for a transaction that committed (the interleaving:
    commit, reply lost, a pass stamps the versions and deletes the entry, the late
    settle). Readers kept seeing its write through the stamp."""
    writer, _ = _collected_writer(tm)
    with pytest.raises(OutcomeForgottenError, match="no longer known") as caught:
        tm.outcome(str(writer), settle=True)
    assert isinstance(caught.value, CommitUnknownError)
    assert not isinstance(caught.value, TransactionAbortedError)
    assert _entry(tm.store, writer) is None  # nothing was written
    assert tm.begin().get("t", HOT.row, HOT.column) == b"a"


def test_settling_a_collected_commit_with_its_cells_finds_the_commit_stamp(
    tm: TransactionManager,
) -> None:
    """Failed before the fix (no way to name the cells; it answered ABORTED): the
    writer's own client names cells it wrote, and the stamp there is the outcome."""
    writer, commit_ts = _collected_writer(tm)
    assert tm.outcome_of(writer, settle=True, written=[("t", HOT)]) == commit_ts
    assert _entry(tm.store, writer) is None


def test_a_writer_above_the_safe_point_with_no_entry_is_still_fenced(
    tm: TransactionManager,
) -> None:
    """The rule changes nothing where no entry can have been collected: a writer that
    never reached its commit point is settled ABORTED (S3), so it can never commit."""
    tx = tm.begin()
    tx.put("t", HOT.row, HOT.column, b"x")
    assert tm.outcome(tx.id, settle=True) is TransactionStatus.ABORTED
    assert _entry(tm.store, tx.start_ts) == encode_outcome(ABORTED)


def test_a_writer_below_the_safe_point_with_an_unstamped_version_is_fenced(
    tm: TransactionManager,
) -> None:
    """Below the safe point an unstamped version of the writer proves it never
    committed (a collected writer has no unstamped version left), so it is fenced."""
    tx = tm.begin()
    tx.put("t", HOT.row, HOT.column, b"x")
    committer = tx.committer()
    committer.step()  # lock
    committer.step()  # write: the version exists, unstamped, no entry
    _commit(tm, OTHER, b"later")
    _, raw = read_state(tm.store)
    tm.store.compare_and_set(
        GC_TABLE, STATE_KEY, raw, GcState(tm._rt.timestamps.next_timestamp(), 0).encode()
    )
    assert tm.outcome_of(tx.start_ts, settle=True, written=[("t", HOT)]) == ABORTED
    assert _entry(tm.store, tx.start_ts) == encode_outcome(ABORTED)


class _CollectBeforeThePut:
    """A store on which a whole garbage-collection pass happens between a settler's
    read of a writer's entry and its put-unless-exists of ABORTED: the writer commits,
    a safe point above it is published, its version stamped and its entry deleted."""

    def __init__(self, store: KVStore, writer: int, commit_ts: int, safe_point: int) -> None:
        self._store = store
        self._writer = writer
        self._commit_ts = commit_ts
        self._safe_point = safe_point
        self.fired = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        if table == TXN_TABLE and key == txn_key(self._writer) and not self.fired:
            self.fired = True
            store = self._store
            _, raw = read_state(store)
            store.compare_and_set(GC_TABLE, STATE_KEY, raw, GcState(self._safe_point, 0).encode())
            store.stamp_versions(
                "t", [VersionStamp(HOT.row, HOT.column, self._writer, self._commit_ts)]
            )
        return self._store.put_unless_exists(table, key, value)


class _NoLocks:
    def wait_until_released(self, descriptors: object, timeout_ms: int) -> bool:
        return True


@pytest.mark.parametrize("seen", [False, True], ids=["by-id-with-cells", "reader"])
def test_a_pass_between_the_entry_read_and_the_put_cannot_turn_a_commit_into_an_abort(
    seen: bool,
) -> None:
    """The window S9 leaves a settler: it reads no entry, the writer commits, a pass
    publishes a safe point above it, stamps its version and deletes its entry, then
    the settler's ABORTED applies. Before the fix the settler answered ABORTED; now it
    reads the safe point after its put, sees it rose above the writer, and the stamp
    decides (both for the writer's own client naming its cells and for a reader that
    found the version)."""
    store = open_store("memory://")
    writer, commit_ts = 10, 20
    store.put_versions("t", [VersionWrite(HOT.row, HOT.column, writer, b"v")])
    racing = _CollectBeforeThePut(store, writer, commit_ts, safe_point=30)
    resolver = StatusResolver(racing, _NoLocks(), TransactionConfig())  # type: ignore[arg-type]
    if seen:
        outcome = resolver.resolve([writer], where={writer: ("t", HOT)})[writer]
    else:
        outcome = resolver.settle(writer, [("t", HOT)])
    assert racing.fired
    assert outcome == commit_ts
