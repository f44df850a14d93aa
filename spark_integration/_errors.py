"""The lakehouse error tree: one root, plus the conflict that callers may retry."""

from __future__ import annotations

from percolake.errors import PercolakeError
from txn.errors import TransactionConflictError


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
    "ConcurrentModificationError",
    "LakehouseError",
    "TableExistsError",
    "TableNotFoundError",
    "VersionNotFoundError",
]
