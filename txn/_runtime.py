"""What a manager's transactions share: store, oracle, locks, resolver, cleaner."""

from __future__ import annotations

from dataclasses import dataclass

from storage_adapters import KVStore
from txn._cleaner import Cleaner
from txn._committer import STEPS
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
    #: The commit protocol's steps: always ``STEPS`` but in tests that show the
    #: checks catch a deliberately broken protocol.
    commit_steps: tuple[str, ...] = STEPS

    @classmethod
    def build(
        cls,
        store: KVStore,
        timestamps: TimestampSource,
        locks: LockService,
        config: TransactionConfig,
        *,
        commit_steps: tuple[str, ...] = STEPS,
    ) -> Runtime:
        unknown = set(commit_steps) - set(STEPS)
        if unknown:
            raise ValueError(f"unknown commit steps {sorted(unknown)}; the steps are {STEPS}")
        resolver = StatusResolver(store, locks, config)
        cleaner = Cleaner(store)
        reader = SnapshotReader(store, resolver, cleaner.submit)
        return cls(
            store,
            timestamps,
            locks,
            config,
            FailPoints[int](),
            resolver,
            reader,
            cleaner,
            commit_steps,
        )
