"""The chaos build's store that answers late after a pause of its process
(``percolake.tools.chaos._reconnect``): a store across a network reconnecting, on SQLite."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from percolake.tools.chaos._reconnect import (
    PAUSE_GAP_S,
    ReconnectingStore,
    reconnect_ms_from_env,
    store_opener,
)
from storage_adapters import KVStore, open_store

pytestmark = pytest.mark.unit


def test_the_chaos_store_answers_late_only_after_a_pause(tmp_path: Path) -> None:
    assert store_opener(0) is open_store
    store = store_opener(300)(f"sqlite:///{tmp_path}/s.db")
    assert isinstance(store, ReconnectingStore)
    try:
        started = time.monotonic()
        store.get_system("_leader", [b"tso"])
        assert time.monotonic() - started < 0.25  # no pause: no delay
        # As if the process had been stopped: the last tick lies a pause ago.
        store._tick -= PAUSE_GAP_S + 1
        started = time.monotonic()
        assert store.get_system("_leader", [b"tso"]) == {}
        assert time.monotonic() - started >= 0.29
        assert store.pauses == 1
    finally:
        store.close()


def test_the_delay_comes_from_the_test_environment_only() -> None:
    assert reconnect_ms_from_env({}) == 0
    assert reconnect_ms_from_env({"PERCOLAKE_CHAOS_STORE_RECONNECT_MS": "250"}) == 250
    with pytest.raises(ValueError, match="0-60000"):
        reconnect_ms_from_env({"PERCOLAKE_CHAOS_STORE_RECONNECT_MS": "-1"})


def test_every_call_of_the_store_contract_goes_through_the_delay() -> None:
    """A store method the wrapper does not define falls back to the base class's
    generic version: slower, and never delayed after a pause. GC's range deletes, index
    prune and candidate sweep did, until they were added here."""
    requests = {
        name
        for name, member in vars(KVStore).items()
        if callable(member) or isinstance(member, property)
    }
    # Not requests: the context manager, and scan, which pages through _scan.
    requests -= {"__enter__", "__exit__", "scan"}
    assert sorted(requests - set(vars(ReconnectingStore))) == []
