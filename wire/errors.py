"""The root of every error percolake raises, and every leaf that crosses the wire.

This module imports nothing, so every package (the store adapters at the bottom,
the gateway wire layer, the oracle, the transaction layer, the lakehouse) can
derive its errors from it, and the wire layer (``wire.error_codes``) maps each leaf
to a gRPC status and back without importing the packages above it. The packages
re-export the leaves they raise (``txn.errors``, ``storage_adapters``, ``tso``,
``lockserver``). ``except PercolakeError`` catches anything percolake
raises on purpose; ``except TransactionError`` catches every failure of a
transactional call, whether it happened in this process, in the store, or in a
gateway. The builtins mixed in (``ConnectionError``, ``PermissionError``) let code
that knows nothing of percolake handle the common cases.
"""

from __future__ import annotations


class PercolakeError(Exception):
    """Root of every error percolake raises on purpose."""


class TransactionError(PercolakeError):
    """Root of every error a transactional call raises (``txn.errors`` re-exports it)."""


class ServiceUnavailableError(TransactionError, ConnectionError):
    """A service the call needs (gateway, oracle, lock server, store) could not serve it.

    Nothing is known to have been applied. A call that may have applied says so with
    a more specific error (``CommitUnknownError``).
    """


class UnauthenticatedError(TransactionError, PermissionError):
    """The bearer token was missing or wrong."""


# --- stores (re-exported by storage_adapters) ----------------------------------------


class StoreError(PercolakeError):
    """Root of the errors a storage backend raises."""


class StoreUnavailableError(StoreError):
    """The store could not be reached; nothing is known to have been written."""


class StoreTimeoutError(StoreError):
    """A write timed out: it may or may not have been applied (rule S6).

    For a conditional write the caller settles the outcome by re-reading the row
    with ``KVStore.get_system`` or by re-issuing the same conditional write.
    """


# --- the oracle and the lock server (re-exported by tso and lockserver) --------------


class OracleFencedError(PercolakeError, RuntimeError):
    """Another oracle took over the bound: this one must stop serving (rule S7)."""


class StaleTokenError(PercolakeError, ValueError):
    """The lock token comes from another epoch: the lock server restarted since."""


# --- transactions (re-exported by txn.errors) -----------------------------------------


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
    """Aborted because of a concurrent transaction; retrying may succeed.

    ``reason`` names the kind of conflict for callers and dashboards: ``conflict``
    unless a subclass says more (``deadlock``: :class:`DeadlockError`)."""

    reason: str = "conflict"


class DeadlockError(TransactionConflictError):
    """Chosen as the victim of a deadlock: the transaction waited in the lock server's
    queue for a lock held, directly or through other waiters, by a transaction that
    waits for one of its own. Nothing was committed; retrying may succeed."""

    reason = "deadlock"


class SnapshotTooOldError(TransactionConflictError):
    """The transaction's snapshot fell below the garbage-collection safe point: versions it
    could read may be swept, so it reads and commits nothing more. A conflict with the
    collector: a new transaction (what ``run`` retries with) reads above it."""


class CommitUnknownError(TransactionError):
    """The commit point was attempted but its outcome could not be settled (rule S6).

    The transaction may or may not have committed. Never retry it blindly: read
    the data back, or retry with an idempotency key.
    """

    def __init__(self, message: str, *, start_ts: int) -> None:
        super().__init__(message)
        self.start_ts = start_ts


class OutcomeForgottenError(CommitUnknownError):
    """The transaction's outcome is no longer known: garbage collection may have
    collected its transactions-table entry, and no version of it that carries a commit
    stamp was found. It may have committed; it is never settled as aborted (rule S9).

    Not an abort: no caller may treat it as "not committed". Read the data back, or
    retry with an idempotency key.
    """


class LakehouseError(PercolakeError):
    """Root of the errors raised by lakehouse tables (transaction errors pass through)."""


class TableNotFoundError(LakehouseError, LookupError):
    """No table of that name exists in this catalog."""


class TableExistsError(LakehouseError):
    """A table of that name already exists (or its location already holds files)."""


class VersionNotFoundError(LakehouseError, LookupError):
    """The table has no such version, or vacuum removed the files it needs."""


class ConcurrentModificationError(LakehouseError, TransactionConflictError):
    """A concurrent change invalidated what this operation depended on; nothing committed.

    Raised when an overwrite finds that the table moved past the version it
    replaced, when a job's files may have been removed by a concurrent vacuum, and
    when a commit could not win the table's head within its retry budget. The
    operation can be retried from the start (re-reading its inputs).
    """


__all__ = [
    "CommitUnknownError",
    "ConcurrentModificationError",
    "DeadlockError",
    "LakehouseError",
    "NotTransactionOwnerError",
    "OracleFencedError",
    "OutcomeForgottenError",
    "PercolakeError",
    "ServiceUnavailableError",
    "SnapshotTooOldError",
    "StaleTokenError",
    "StoreError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "TableExistsError",
    "TableNotFoundError",
    "TransactionAbortedError",
    "TransactionClosedError",
    "TransactionConflictError",
    "TransactionError",
    "TransactionLimitError",
    "TransactionNotFoundError",
    "UnauthenticatedError",
    "VersionNotFoundError",
]
