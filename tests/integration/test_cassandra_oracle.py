"""The oracle on a real Cassandra node: a bound update that timed out (issue 18, item 3).

The compare-and-set that moves the oracle's persisted bound is a lightweight
transaction; Cassandra can time it out after it applied. Here the real compare-and-set
runs on the node and its answer is then replaced by a timeout, as a lost reply does.
Before the fix the oracle passed the timeout up unsettled, its next extension compared
against the value it had replaced, failed, and fenced the only oracle for good
although the row held its own value. Now it reads the row back at SERIAL (rule S6):
its own value means applied, the old value means retry. Runs on the Paxos v2 node and
on the Paxos v1 node.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage_adapters import KVStore, StoreTimeoutError, open_store
from tso import TimestampOracle

pytestmark = [pytest.mark.integration, pytest.mark.cassandra]


class _LostReplies:
    """Arms the next compare-and-set of the store to lose its reply, applied or not."""

    def __init__(self, store: KVStore) -> None:
        self.armed: bool | None = None  # None: pass; True: apply, then time out
        real = store.compare_and_set

        def compare_and_set(table: str, key: bytes, expected: bytes, value: bytes) -> object:
            applied, self.armed = self.armed, None
            if applied is None:
                return real(table, key, expected, value)
            if applied:
                real(table, key, expected, value)
            raise StoreTimeoutError("bound update timed out (reply lost, injected)")

        store.compare_and_set = compare_and_set  # type: ignore[method-assign, assignment]


# Parameters named as conftest's store backends, so the test joins the workers' group
# of the session's Cassandra nodes (tests/conftest.py, _shared_jvm).
@pytest.fixture(params=["cassandra", "cassandra-paxos-v1"], ids=["paxos-v2", "paxos-v1"])
def store(request: pytest.FixtureRequest) -> Iterator[KVStore]:
    fixture = (
        "cassandra_store_url" if request.param == "cassandra" else "cassandra_paxos_v1_store_url"
    )
    opened = open_store(str(request.getfixturevalue(fixture)))
    yield opened
    opened.close()


def serve(oracle: TimestampOracle, count: int) -> list[int]:
    return [oracle.next_timestamp() for _ in range(count)]


def test_a_bound_update_that_applied_but_timed_out_does_not_fence_the_oracle(
    store: KVStore,
) -> None:
    faults = _LostReplies(store)
    oracle = TimestampOracle(store, window=3)
    served = serve(oracle, 3)
    faults.armed = True  # the next extension applies on the node, its reply is lost
    served += serve(oracle, 10)
    assert not oracle.fenced
    assert served == sorted(set(served))
    oracle.close()
    # A restarted oracle starts above everything served.
    again = TimestampOracle(store, window=3)
    assert again.next_timestamp() > served[-1]
    again.close()


def test_a_bound_update_that_timed_out_without_applying_is_retried(store: KVStore) -> None:
    faults = _LostReplies(store)
    oracle = TimestampOracle(store, window=3)
    served = serve(oracle, 3)
    faults.armed = False
    with pytest.raises(StoreTimeoutError):  # nothing was reserved: this request fails
        oracle.next_timestamp()
    served += serve(oracle, 10)
    assert not oracle.fenced
    assert served == sorted(set(served))
    oracle.close()
