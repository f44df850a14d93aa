"""Snapshot-isolated and serializable transactions over any ``KVStore``.

See README.md for the API and docs/design/protocol.md for the protocol and its safety rules.
"""

from txn._api import Manager, ReadTransaction, Transaction
from txn._committer import COMMIT_STEPS, CommitAttempt
from txn._config import TransactionConfig
from txn._gc import GarbageCollector, GcLoop, GcReport, GcStoppedError
from txn._isolation import Isolation, TransactionStatus
from txn._manager import TransactionManager
from txn._retry import CONFLICTS, ConflictRate, RetriesExhaustedError, RetryPolicy, run_transaction
from txn._safepoint import DEFAULT_GRACE_MS, Registration
from txn._services import LockService, TimestampSource
from txn._transaction import EmbeddedTransaction

__all__ = [
    "COMMIT_STEPS",
    "CONFLICTS",
    "DEFAULT_GRACE_MS",
    "CommitAttempt",
    "ConflictRate",
    "EmbeddedTransaction",
    "GarbageCollector",
    "GcLoop",
    "GcReport",
    "GcStoppedError",
    "Isolation",
    "LockService",
    "Manager",
    "ReadTransaction",
    "Registration",
    "RetriesExhaustedError",
    "RetryPolicy",
    "TimestampSource",
    "Transaction",
    "TransactionConfig",
    "TransactionManager",
    "TransactionStatus",
    "run_transaction",
]
