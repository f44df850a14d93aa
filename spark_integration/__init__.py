"""Lakehouse tables on percolake: every commit of a Spark job is one transaction.

See CONTRACT.md ("Lakehouse tables") for the API and DESIGN.md ("Spark") for what
it guarantees; ``engine.model`` documents how the metadata is laid out in cells.

The Spark side (``Lakehouse``, ``write_cells``, the ``percolake`` data source and
its ``register(spark)``) is imported on first use, so the
gateway's lakehouse service (``spark_integration.service.servicer``), which needs only the
metadata layer, starts without loading PySpark and pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spark_integration.engine import (
    ChangeCommitError,
    ColumnStats,
    Commit,
    ConcurrentModificationError,
    DataFile,
    ExpireResult,
    LakehouseError,
    Retention,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
    VersionVacuumedError,
)

if TYPE_CHECKING:
    from spark_integration._cells import write_cells
    from spark_integration._lakehouse import Lakehouse
    from spark_integration.datasource import PercolakeDataSource, register

_LAZY = {
    "Lakehouse": "spark_integration._lakehouse",
    "PercolakeDataSource": "spark_integration.datasource",
    "register": "spark_integration.datasource",
    "write_cells": "spark_integration._cells",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ChangeCommitError",
    "ColumnStats",
    "Commit",
    "ConcurrentModificationError",
    "DataFile",
    "ExpireResult",
    "Lakehouse",
    "LakehouseError",
    "PercolakeDataSource",
    "Retention",
    "TableExistsError",
    "TableNotFoundError",
    "VersionNotFoundError",
    "VersionVacuumedError",
    "register",
    "write_cells",
]
