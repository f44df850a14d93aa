"""The lakehouse error tree: one root, plus the conflict that callers may retry.

Defined in :mod:`percolake.errors` (they cross the wire from the gateway's
``LakehouseService``) and re-exported here.
"""

from __future__ import annotations

from percolake.errors import (
    ConcurrentModificationError,
    LakehouseError,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
)

__all__ = [
    "ConcurrentModificationError",
    "LakehouseError",
    "TableExistsError",
    "TableNotFoundError",
    "VersionNotFoundError",
]
