"""Snapshot-isolated and serializable transactions over any ``KVStore``.

See CONTRACT.md for the API and DESIGN.md for the protocol and its safety rules.
"""

from txn._api import Manager, ReadTransaction, Transaction
from txn._committer import COMMIT_STEPS, CommitAttempt
from txn._config import TransactionConfig
from txn._gc import GarbageCollector, GcLoop, GcReport
from txn._isolation import Isolation, TransactionStatus
from txn._manager import TransactionManager
from txn._transaction import EmbeddedTransaction

__all__ = [
    "COMMIT_STEPS",
    "CommitAttempt",
    "EmbeddedTransaction",
    "GarbageCollector",
    "GcLoop",
    "GcReport",
    "Isolation",
    "Manager",
    "ReadTransaction",
    "Transaction",
    "TransactionConfig",
    "TransactionManager",
    "TransactionStatus",
]
