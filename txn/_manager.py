"""``TransactionManager``: begins transactions and owns what they share."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from lockserver import LockTable

if TYPE_CHECKING:
    from txn.remote import RemoteTransactionManager
    from wire.auth import TlsConfig
from storage_adapters import Cell, KVStore, StoreError, open_store
from tso import OracleFencedError, TimestampBatcher, TimestampOracle
from txn._args import check_isolation, check_txn_id
from txn._committer import COMMIT_STEPS
from txn._config import TransactionConfig
from txn._isolation import Isolation, TransactionStatus
from txn._retry import RetryPolicy, run_transaction
from txn._runtime import Runtime
from txn._services import LockService, TimestampSource
from txn._status import ABORTED
from txn._transaction import EmbeddedTransaction
from txn.errors import ServiceUnavailableError, TransactionError
from txn.failpoints import FailPoints

log = logging.getLogger(__name__)

T = TypeVar("T")


class TransactionManager:
    """Begins transactions. Safe to share between threads.

    Build one with :meth:`embedded` (oracle, lock server and store in this
    process) or :meth:`remote` (through a percolake gateway).
    """

    def __init__(
        self,
        store: KVStore,
        timestamps: TimestampSource,
        locks: LockService,
        config: TransactionConfig | None = None,
        *,
        owns: tuple[object, ...] = (),
        commit_steps: tuple[str, ...] = COMMIT_STEPS,
    ) -> None:
        """``commit_steps`` other than ``COMMIT_STEPS`` build a deliberately broken protocol,
        for tests that show the checks catch one; nothing else may pass it."""
        self._rt = Runtime.build(
            store, timestamps, locks, config or TransactionConfig(), commit_steps=commit_steps
        )
        self._owns = owns
        self._closed = False
        self._close_lock = threading.Lock()

    @classmethod
    def embedded(
        cls,
        store_url: str = "sqlite:///.percolake/store.db",
        config: TransactionConfig | None = None,
    ) -> TransactionManager:
        """Oracle, lock server and store in this process: the embedded default."""
        store = open_store(store_url)
        try:
            oracle = TimestampOracle(store)
        except BaseException:
            store.close()  # e.g. another oracle holds this store (S7): leave nothing open
            raise
        return cls(
            store,
            TimestampBatcher(oracle.next_range),
            LockTable(),
            config,
            owns=(oracle, store),  # the oracle first: it hands its leader lease over
        )

    @classmethod
    def remote(
        cls,
        address: str,
        token: str | None = None,
        *,
        tls: TlsConfig | None = None,
        timeout_s: float = 60.0,
        config: TransactionConfig | None = None,
    ) -> RemoteTransactionManager:
        """A manager that talks to a percolake gateway (``percolake serve``) over gRPC.

        Both managers satisfy :class:`txn.Manager`; the remote one can also ``attach``.
        """
        from txn.remote import RemoteTransactionManager

        return RemoteTransactionManager(
            address, token=token, tls=tls, timeout_s=timeout_s, config=config
        )

    # --- what tests and operators reach into -------------------------------------

    @property
    def store(self) -> KVStore:
        return self._rt.store

    @property
    def failpoints(self) -> FailPoints[int]:
        """Fault-injection points of this manager's commit path (tests only)."""
        return self._rt.failpoints

    @property
    def config(self) -> TransactionConfig:
        return self._rt.config

    @property
    def locks(self) -> LockService:
        return self._rt.locks

    def replace_locks(self, locks: LockService) -> None:
        """Point at another lock server, as after a lock server restart."""
        self._rt.locks = locks
        self._rt.resolver._locks = locks

    def outcome(self, txn_id: str, *, settle: bool = False) -> TransactionStatus | None:
        """``COMMITTED`` or ``ABORTED`` once decided; ``None`` while undecided.

        With ``settle`` the answer is final: an undecided transaction is settled as
        aborted (rule S3), so it can never commit afterwards. A transaction whose entry
        garbage collection may have collected is never settled that way: its outcome is
        found from its commit stamps, or :class:`~txn.errors.OutcomeForgottenError`
        (a ``CommitUnknownError``) says it is no longer known.
        """
        if not check_txn_id(txn_id).isdigit():
            raise ValueError(f"txn_id must be a transaction id (a str of digits), got {txn_id!r}")
        found = self.outcome_of(int(txn_id), settle=settle)
        if found is None:
            return None
        return TransactionStatus.ABORTED if found == ABORTED else TransactionStatus.COMMITTED

    def outcome_of(
        self, start_ts: int, *, settle: bool = False, written: Sequence[tuple[str, Cell]] = ()
    ) -> int | None:
        """The commit timestamp of the transaction that started at ``start_ts``, or ABORTED
        (-1); ``None`` while undecided. With ``settle``, an undecided one is settled
        (S3, :meth:`txn._status.StatusResolver.settle`); ``written`` names cells it wrote,
        where its commit stamps are looked for once its entry may have been collected.
        """
        resolver = self._rt.resolver
        try:
            if settle:
                return resolver.settle(start_ts, written)
            return resolver.read([start_ts]).get(start_ts)
        except StoreError as exc:
            raise ServiceUnavailableError(
                f"outcome of transaction {start_ts} unknown: the store failed: {exc}"
            ) from exc

    def wait_for_cleanup(self) -> None:
        """Block until queued removal of aborted versions is done."""
        self._rt.cleaner.drain()

    # --- transactions ------------------------------------------------------------

    def begin(
        self, isolation: Isolation = Isolation.SNAPSHOT, *, pessimistic: bool = False
    ) -> EmbeddedTransaction:
        """A new transaction; ``pessimistic``: its ``get`` locks (``get_for_update``)."""
        check_isolation(isolation)
        if not isinstance(pessimistic, bool):
            raise TypeError(f"pessimistic must be a bool, got {pessimistic!r}")
        if self._closed:
            raise TransactionError("transaction manager is closed")
        try:
            start_ts = self._rt.timestamps.next_timestamp()
        except (StoreError, OracleFencedError) as exc:
            raise ServiceUnavailableError(f"no start timestamp: {exc}") from exc
        txn = EmbeddedTransaction(self._rt, start_ts, isolation, pessimistic=pessimistic)
        self._rt.active.add(txn)
        self._rt.registration.start()
        return txn

    def run(
        self,
        fn: Callable[[EmbeddedTransaction], T],
        isolation: Isolation = Isolation.SNAPSHOT,
        max_attempts: int = 10,
        *,
        pessimistic: bool = False,
    ) -> T:
        """Run ``fn(tx)`` and commit, retrying on conflicts with jittered backoff.

        Only :class:`TransactionConflictError` is retried: it guarantees that the
        attempt did not commit. An unknown outcome is never retried blindly (S6).
        ``pessimistic``: each attempt's ``get`` locks the cell (``get_for_update``), so
        what is left to retry is deadlock victims, lock-wait timeouts and the rarer
        conflicts locks do not prevent (docs/design/protocol.md, "Pessimistic reads").
        """
        if not isinstance(pessimistic, bool):
            raise TypeError(f"pessimistic must be a bool, got {pessimistic!r}")
        policy = RetryPolicy(max_attempts=max_attempts)

        def begin(isolation: Isolation) -> EmbeddedTransaction:
            return self.begin(isolation, pessimistic=pessimistic)

        return run_transaction(begin, self.outcome, fn, policy, isolation=isolation)[0]

    def attach(self, txn_id: str) -> EmbeddedTransaction:
        raise TransactionError(
            "attach() joins a transaction that another process began; it needs a remote "
            "manager (TransactionManager.remote)"
        )

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._rt.registration.close()
        self._rt.cleaner.drain()
        self._rt.cleaner.close()
        for resource in self._owns:
            close = getattr(resource, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> TransactionManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
