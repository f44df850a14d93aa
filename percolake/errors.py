"""The root of every error percolake raises, and the leaves that cross package lines.

This module imports nothing, so every package (the store adapters at the bottom,
the gateway wire layer, the oracle, the transaction layer, the lakehouse) can
derive its errors from it. ``except PercolakeError`` catches anything percolake
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


__all__ = [
    "PercolakeError",
    "ServiceUnavailableError",
    "TransactionError",
    "UnauthenticatedError",
]
