"""The lakehouse error tree: one root, plus the conflict that callers may retry.

Most are defined in :mod:`wire.errors` (they cross the wire from the gateway's
``LakehouseService``) and re-exported here; the two streaming errors are raised in the
Spark process only.
"""

from __future__ import annotations

from wire.errors import (
    ConcurrentModificationError,
    LakehouseError,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
)


class ChangeCommitError(LakehouseError, RuntimeError):
    """A streaming read met a version that removed files (an overwrite)."""


class VersionVacuumedError(LakehouseError, RuntimeError):
    """A streaming read needs the files of a version that vacuum removed."""


__all__ = [
    "ChangeCommitError",
    "ConcurrentModificationError",
    "LakehouseError",
    "TableExistsError",
    "TableNotFoundError",
    "VersionNotFoundError",
    "VersionVacuumedError",
]
