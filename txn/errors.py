"""The transaction error tree: one root, with "not committed" apart from "unknown"."""

from __future__ import annotations

from percolake.errors import (
    PercolakeError,
    ServiceUnavailableError,
    TransactionError,
    UnauthenticatedError,
)


class TransactionClosedError(TransactionError):
    """The transaction was already committed, aborted or failed: it cannot be used."""


class TransactionNotFoundError(TransactionError):
    """No open transaction has this id (never begun here, finished, or reaped as idle)."""


class NotTransactionOwnerError(TransactionError):
    """Only the process that began a transaction may commit it; attached ones may not."""


class TransactionLimitError(TransactionError):
    """A limit of the gateway was reached (buffered writes, open transactions)."""


class TransactionAbortedError(TransactionError):
    """The transaction definitely did not commit; none of its writes are visible."""


class TransactionConflictError(TransactionAbortedError):
    """Aborted because of a concurrent transaction; retrying may succeed."""


class CommitUnknownError(TransactionError):
    """The commit point was attempted but its outcome could not be settled (rule S6).

    The transaction may or may not have committed. Never retry it blindly: read
    the data back, or retry with an idempotency key.
    """

    def __init__(self, message: str, *, start_ts: int) -> None:
        super().__init__(message)
        self.start_ts = start_ts


__all__ = [
    "CommitUnknownError",
    "NotTransactionOwnerError",
    "PercolakeError",
    "ServiceUnavailableError",
    "TransactionAbortedError",
    "TransactionClosedError",
    "TransactionConflictError",
    "TransactionError",
    "TransactionLimitError",
    "TransactionNotFoundError",
    "UnauthenticatedError",
]
