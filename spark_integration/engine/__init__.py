"""The lakehouse metadata engine: tables, versions and files in percolake transactions.

Neither Spark nor gRPC: the engine runs inside a client's process (an embedded
``Lakehouse``) and inside the gateway's lakehouse service alike, and a layer
contract in pyproject.toml keeps PySpark, grpc and the wire protocol out of it.
``model`` lays the metadata out in cells; ``catalog`` is the one entry point
the service and the Spark side use.
"""

from __future__ import annotations

from spark_integration.engine.catalog import Catalog, now_ms
from spark_integration.engine.commit import CommitRequest, Committed
from spark_integration.engine.errors import (
    ChangeCommitError,
    ConcurrentModificationError,
    LakehouseError,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
    VersionVacuumedError,
)
from spark_integration.engine.history import HistoryEntry
from spark_integration.engine.model import ColumnStats, Commit, DataFile, DmlResult
from spark_integration.engine.retention import ExpireResult, Retention

__all__ = [
    "Catalog",
    "ChangeCommitError",
    "ColumnStats",
    "Commit",
    "CommitRequest",
    "Committed",
    "ConcurrentModificationError",
    "DataFile",
    "DmlResult",
    "ExpireResult",
    "HistoryEntry",
    "LakehouseError",
    "Retention",
    "TableExistsError",
    "TableNotFoundError",
    "VersionNotFoundError",
    "VersionVacuumedError",
    "now_ms",
]
