"""The transaction error tree: one root, with "not committed" apart from "unknown".

The classes live in :mod:`wire.errors`, the one root every package derives
from; this is where transaction code imports them.
"""

from __future__ import annotations

from wire.errors import (
    CommitUnknownError,
    DeadlockError,
    NotTransactionOwnerError,
    OutcomeForgottenError,
    PercolakeError,
    ServiceUnavailableError,
    SnapshotTooOldError,
    TransactionAbortedError,
    TransactionClosedError,
    TransactionConflictError,
    TransactionError,
    TransactionLimitError,
    TransactionNotFoundError,
    UnauthenticatedError,
)

__all__ = [
    "CommitUnknownError",
    "DeadlockError",
    "NotTransactionOwnerError",
    "OutcomeForgottenError",
    "PercolakeError",
    "ServiceUnavailableError",
    "SnapshotTooOldError",
    "TransactionAbortedError",
    "TransactionClosedError",
    "TransactionConflictError",
    "TransactionError",
    "TransactionLimitError",
    "TransactionNotFoundError",
    "UnauthenticatedError",
]
