"""What a manager's transactions share: store, oracle, locks, resolver, cleaner."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Protocol

from storage_adapters import KVStore
from txn._cleaner import Cleaner
from txn._committer import COMMIT_STEPS, steps_named
from txn._config import TransactionConfig
from txn._isolation import TransactionStatus
from txn._safepoint import Registration, SafePointGuard
from txn._services import LockService, TimestampSource
from txn._snapshot import SnapshotReader
from txn._status import StatusResolver
from txn.failpoints import FailPoints


class _Tracked(Protocol):
    start_ts: int

    @property
    def status(self) -> TransactionStatus: ...


class ActiveTransactions:
    """The transactions a manager began that may still read or commit, weakly held:
    what its garbage-collection registration publishes (rule S8)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._txns: weakref.WeakSet[_Tracked] = weakref.WeakSet()
        self.latest_ts = 0

    def add(self, txn: _Tracked) -> None:
        with self._lock:
            self._txns.add(txn)
            self.latest_ts = max(self.latest_ts, txn.start_ts)

    def oldest(self) -> tuple[int | None, int]:
        """The oldest start_ts still active or committing (``None``: none), and the
        newest start_ts this manager was served."""
        live = (TransactionStatus.ACTIVE, TransactionStatus.COMMITTING)
        with self._lock:
            txns = list(self._txns)
            latest = self.latest_ts
        starts = [t.start_ts for t in txns if t.status in live]
        return (min(starts) if starts else None), latest


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
    guard: SafePointGuard
    active: ActiveTransactions
    registration: Registration
    #: The commit protocol's steps: always ``COMMIT_STEPS`` but in tests that show the
    #: checks catch a deliberately broken protocol.
    commit_steps: tuple[str, ...] = COMMIT_STEPS

    @classmethod
    def build(
        cls,
        store: KVStore,
        timestamps: TimestampSource,
        locks: LockService,
        config: TransactionConfig,
        *,
        commit_steps: tuple[str, ...] = COMMIT_STEPS,
    ) -> Runtime:
        steps_named(commit_steps)  # an unknown name fails here, not at the first commit
        resolver = StatusResolver(store, locks, config)
        cleaner = Cleaner(store)
        reader = SnapshotReader(store, resolver, cleaner.submit)
        active = ActiveTransactions()
        registration = Registration(
            store, active.oldest, interval_s=config.gc_publish_interval_ms / 1000
        )
        return cls(
            store,
            timestamps,
            locks,
            config,
            FailPoints[int](),
            resolver,
            reader,
            cleaner,
            SafePointGuard(store),
            active,
            registration,
            commit_steps,
        )
