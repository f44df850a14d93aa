"""The timestamp oracle and its client-side batcher (rule S7)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from storage_adapters import KVStore, StoreTimeoutError, open_store
from storage_adapters.memory import MemoryStore
from tso import (
    TSO_TABLE,
    OracleAlreadyRunningError,
    OracleFencedError,
    TimestampBatcher,
    TimestampOracle,
    TimestampRange,
)

pytestmark = pytest.mark.unit


def test_timestamps_strictly_increase_singly_and_in_ranges() -> None:
    oracle = TimestampOracle(open_store("memory://"), window=10)
    seen = [oracle.next_timestamp() for _ in range(25)]
    r = oracle.next_range(7)
    seen += list(range(r.first, r.first + r.count))
    seen.append(oracle.next_timestamp())
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert r.last == r.first + 6


def test_oracle_monotonic_across_restarts_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tso.db"
    served: list[int] = []
    for _ in range(5):
        store = open_store(url)
        oracle = TimestampOracle(store, window=8)
        served += [oracle.next_timestamp() for _ in range(13)]
        store.close()  # a crash loses the unserved part of the window, nothing else
    assert served == sorted(served) and len(set(served)) == len(served)


def test_oracle_restart_is_above_every_served_timestamp_on_every_backend(
    store_url_factory: Callable[[], str],
) -> None:
    store = open_store(store_url_factory())
    first = TimestampOracle(store, window=5)
    high = max(first.next_timestamp() for _ in range(12))
    first.close()  # a restart: the old oracle is gone before the new one starts
    second = TimestampOracle(store if "memory" in store.url else open_store(store_url_factory()))
    assert second.next_timestamp() > high


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_second_oracle_on_a_store_that_enforces_claims_refuses_to_start(
    backend: str, tmp_path: Path
) -> None:
    """The stores that can enforce a claim (Cassandra cannot until leader leases land;
    ``test_second_oracle_fences_the_first_where_claims_cannot_be_enforced`` covers it)."""
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path}/tso.db"
    store = open_store(url)
    assert store.claim("probe").exclusive
    first = TimestampOracle(store, window=5)
    before = first.next_timestamp()
    other = store if backend == "memory" else open_store(url)
    with pytest.raises(OracleAlreadyRunningError, match="another timestamp oracle"):
        TimestampOracle(other, window=5)
    assert first.next_timestamp() > before  # neither fenced nor disturbed
    first.close()
    with pytest.raises(OracleFencedError, match="closed"):  # gone for good
        first.next_timestamp()
    assert TimestampOracle(other).next_timestamp() > before


def test_closing_the_store_stops_the_oracle(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/tso.db")
    oracle = TimestampOracle(store, window=100)
    oracle.next_timestamp()
    store.close()  # releases the claim: another oracle may start now
    with pytest.raises(OracleFencedError):
        oracle.next_timestamp()


class _Unclaimable(MemoryStore):
    """A store that cannot enforce claims, as Cassandra until leader leases exist."""

    claim = KVStore.claim


def test_second_oracle_is_refused_by_the_leader_lease_where_claims_cannot_be_enforced() -> None:
    store = _Unclaimable()
    first = TimestampOracle(store, window=4)
    a = [first.next_timestamp() for _ in range(6)]
    with pytest.raises(OracleAlreadyRunningError, match="leads memory://"):
        TimestampOracle(store, window=4)  # waits out one lease: the first one renews
    b = [first.next_timestamp() for _ in range(6)]
    assert min(b) > max(a)
    first.close()  # hands the lease over: the next oracle starts at once
    third = TimestampOracle(store, window=4)
    assert third.next_timestamp() > max(b)


def test_second_oracle_fences_the_first_behind_claims_and_leases() -> None:
    """The last line of S7: an oracle that neither claims nor leases (the test build)
    still cannot serve beside another once the bound row moved under it."""
    store = _Unclaimable()
    first = TimestampOracle(store, window=4, claim_store=False)
    a = [first.next_timestamp() for _ in range(4)]  # exhausts the window
    second = TimestampOracle(store, window=4, claim_store=False)
    b = [second.next_timestamp() for _ in range(6)]
    with pytest.raises(OracleFencedError):
        first.next_timestamp()
    with pytest.raises(OracleFencedError):  # and stays fenced
        first.next_range(1)
    assert first.fenced
    assert min(b) > max(a)


def test_oracle_refuses_bad_arguments() -> None:
    oracle = TimestampOracle(open_store("memory://"))
    with pytest.raises(ValueError, match="positive"):
        oracle.next_range(0)
    with pytest.raises(TypeError):
        oracle.next_range("3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        TimestampOracle(open_store("memory://"), window=0)


def test_corrupt_bound_row_is_reported(store: KVStore) -> None:
    store.put_unless_exists(TSO_TABLE, b"bound", b"not-a-number")
    with pytest.raises(Exception, match="corrupt oracle bound"):
        TimestampOracle(store)


def test_batcher_gives_concurrent_callers_distinct_increasing_timestamps() -> None:
    oracle = TimestampOracle(open_store("memory://"), window=1000)
    gate = threading.Event()

    def slow_fetch(n: int) -> TimestampRange:
        gate.wait(0.005)  # keep a call in flight so that callers pile up
        return oracle.next_range(n)

    batcher = TimestampBatcher(slow_fetch)
    per_thread: dict[int, list[int]] = {}

    def client(i: int) -> None:
        per_thread[i] = [batcher.next_timestamp() for _ in range(50)]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [ts for tss in per_thread.values() for ts in tss]
    assert len(everything) == 16 * 50 == len(set(everything))
    for tss in per_thread.values():
        assert tss == sorted(tss)
    assert batcher.calls < 16 * 50  # requests were coalesced


def test_batcher_never_hands_out_a_timestamp_older_than_the_call() -> None:
    oracle = TimestampOracle(open_store("memory://"))
    batcher = TimestampBatcher(oracle.next_range)
    errors: list[str] = []

    def client() -> None:
        for _ in range(200):
            before = oracle.next_timestamp()
            got = batcher.next_timestamp()
            if got <= before:
                errors.append(f"{got} <= {before}")

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_batcher_passes_failures_to_every_waiter_of_the_batch() -> None:
    def failing(n: int) -> TimestampRange:
        raise OracleFencedError("gone")

    batcher = TimestampBatcher(failing)
    with pytest.raises(OracleFencedError):
        batcher.next_timestamp()
    with pytest.raises(OracleFencedError):  # the batcher is not wedged afterwards
        batcher.next_range(3)


class _FlakyBound(MemoryStore):
    """Compare-and-set of the bound fails once with a timeout, applied or not."""

    def __init__(self, *, applied: bool, reads_fail: int = 0) -> None:
        super().__init__()
        self.fail_next_cas: bool = False
        self.applied = applied
        self.reads_fail = reads_fail

    def compare_and_set(self, table, key, expected, value):  # type: ignore[no-untyped-def]
        if self.fail_next_cas and table == TSO_TABLE:  # not the leader lease's row
            self.fail_next_cas = False
            if self.applied:
                super().compare_and_set(table, key, expected, value)
            raise StoreTimeoutError("bound update timed out (injected)")
        return super().compare_and_set(table, key, expected, value)

    def get_system(self, table, keys):  # type: ignore[no-untyped-def]
        if self.reads_fail and table == TSO_TABLE and not self.fail_next_cas:
            self.reads_fail -= 1
            raise StoreTimeoutError("read timed out (injected)")
        return super().get_system(table, keys)


@pytest.mark.parametrize("reads_fail", [0, 1])
def test_a_bound_update_that_timed_out_but_applied_does_not_fence_the_oracle(
    reads_fail: int,
) -> None:
    """Issue 18, item 3; failed before the fix: the timeout passed up unsettled, the next
    extension compared against the old value, failed, and fenced the only oracle for
    good although the row held its own value. Now it reads the row back (S6)."""
    store = _FlakyBound(applied=True)
    oracle = TimestampOracle(store, window=3)
    served = [oracle.next_timestamp() for _ in range(3)]
    store.fail_next_cas, store.reads_fail = True, reads_fail
    if reads_fail:
        with pytest.raises(StoreTimeoutError):  # in doubt, and the read failed too
            oracle.next_timestamp()
    served += [oracle.next_timestamp() for _ in range(10)]
    assert not oracle.fenced
    assert served == sorted(set(served))


def test_a_bound_update_that_timed_out_and_did_not_apply_is_retried() -> None:
    store = _FlakyBound(applied=False)
    oracle = TimestampOracle(store, window=3)
    served = [oracle.next_timestamp() for _ in range(3)]
    store.fail_next_cas = True
    with pytest.raises(StoreTimeoutError):  # nothing reserved: this request fails
        oracle.next_timestamp()
    served += [oracle.next_timestamp() for _ in range(10)]
    assert not oracle.fenced
    assert served == sorted(set(served))


def test_a_timed_out_bound_update_that_lost_to_another_oracle_fences() -> None:
    store = _FlakyBound(applied=False)
    # Neither claims nor leases (the test build): another oracle may start, as after
    # a lost lease, and the first keeps serving as if nothing happened.
    first = TimestampOracle(store, window=3, claim_store=False)
    [first.next_timestamp() for _ in range(3)]
    TimestampOracle(store, window=3, claim_store=False)  # moves the bound
    store.fail_next_cas = True
    with pytest.raises(OracleFencedError):
        first.next_timestamp()
    assert first.fenced
