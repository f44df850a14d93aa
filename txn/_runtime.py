"""What a manager's transactions share: store, oracle, locks, resolver, cleaner."""

from __future__ import annotations

from dataclasses import dataclass

from storage_adapters import KVStore
from txn._cleaner import Cleaner
from txn._config import TransactionConfig
from txn._services import LockService, TimestampSource
from txn._snapshot import SnapshotReader
from txn._status import StatusResolver
from txn.failpoints import FailPoints


@dataclass(slots=True)
class Runtime:
    store: KVStore
    timestamps: TimestampSource
    locks: LockService
    config: TransactionConfig
    failpoints: FailPoints[int]
    resolver: StatusResolver
    reader: SnapshotReader
    cleaner: Cleaner

    @classmethod
    def build(
        cls,
        store: KVStore,
        timestamps: TimestampSource,
        locks: LockService,
        config: TransactionConfig,
    ) -> Runtime:
        resolver = StatusResolver(store, locks, config)
        cleaner = Cleaner(store)
        reader = SnapshotReader(store, resolver, cleaner.submit)
        return cls(store, timestamps, locks, config, FailPoints[int](), resolver, reader, cleaner)
