"""Settling undecided writers (rule S3) when the store misbehaves."""

from __future__ import annotations

import pytest

from storage_adapters import CasResult, StoreError, open_store
from storage_adapters.memory import MemoryStore
from txn import TransactionConfig
from txn._status import StatusResolver

pytestmark = pytest.mark.unit


class _NoAnswerStore(MemoryStore):
    """A store whose conditional write breaks the contract: not applied, no value."""

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        return CasResult(applied=False, current=None)


class _NoLocks:
    def wait_until_released(self, descriptors: object, timeout_ms: int) -> bool:
        return True


def test_settle_aborted_without_an_answer_is_an_error_not_an_abort() -> None:
    """Issue 12; failed before the fix: "not applied and no current value" was taken
    as ABORTED, which would let a reader skip a version whose writer committed."""
    store = _NoAnswerStore("memory://")
    resolver = StatusResolver(store, _NoLocks(), TransactionConfig())  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="outcome stays unknown"):
        resolver.settle_aborted(42)
    assert resolver.cached(42) is None


def test_settle_aborted_on_a_healthy_store_records_the_abort() -> None:
    store = open_store("memory://")
    resolver = StatusResolver(store, _NoLocks(), TransactionConfig())  # type: ignore[arg-type]
    assert resolver.settle_aborted(7) == -1
    assert resolver.read([7]) == {7: -1}
