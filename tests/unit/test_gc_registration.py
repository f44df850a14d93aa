"""The GC registration's publications (``txn._safepoint.Registration``): one at a time.

Found by ci18 under full-suite load: the publish loop's first tick could read what was
open, be descheduled, and then write its stale entry over the entry of a later tick,
so a long-running transaction's hold on the safe point vanished until the next tick.
"""

from __future__ import annotations

import threading

import pytest

from storage_adapters import open_store
from txn._safepoint import CLIENTS_KEY, Registration, decode_clients
from txn.tables import GC_TABLE

pytestmark = pytest.mark.unit


def test_a_tick_that_read_earlier_never_overwrites_a_later_ticks_entry() -> None:
    """Fails before the fix: the slow tick, holding (nothing open, latest 2) from
    before the transaction at 3 began, wrote that over the fast ticks' (3, 5)."""
    store = open_store("memory://")
    entered, release = threading.Event(), threading.Event()
    open_now = {"value": (None, 2)}

    def oldest() -> tuple[int | None, int]:
        value = open_now["value"]
        if threading.current_thread().name == "slow-tick":
            entered.set()
            release.wait(30)  # descheduled between reading and publishing
        return value

    registration = Registration(store, oldest, interval_s=10**6)
    slow = threading.Thread(target=registration.tick, name="slow-tick")
    slow.start()
    assert entered.wait(30)
    open_now["value"] = (3, 5)  # a transaction at 3 began, and stays open
    fast = threading.Thread(target=lambda: [registration.tick() for _ in range(2)])
    fast.start()
    fast.join(timeout=1)  # with the fix it waits for the slow tick; without, it is done
    release.set()
    slow.join(timeout=30)
    fast.join(timeout=30)
    assert not slow.is_alive() and not fast.is_alive()
    raw = store.get_system(GC_TABLE, [CLIENTS_KEY])[CLIENTS_KEY]
    entry = decode_clients(raw)[registration.id]
    assert (entry.oldest, entry.latest_ts) == (3, 5)
    store.close()
