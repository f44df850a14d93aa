"""Lakehouse tables on percolake: every commit of a Spark job is one transaction.

See docs/lakehouse.md for the API and docs/design/lakehouse.md for what it
guarantees. One sub-package per deployment side, each importing only those below:

* ``spark``: the Spark client (``Lakehouse``, the ``percolake`` data source, the
  commit hook, ``write_cells``, ``s3a_conf`` for sessions that read ``s3://``
  tables), run by Spark drivers and executors;
* ``service``: the gateway's gRPC ``LakehouseService`` and its client;
* ``engine``: the metadata engine (``engine.model`` lays it out in cells), with
  neither Spark nor gRPC.

The Spark side is imported on first use, so the gateway's lakehouse service, which
needs only the engine, starts without loading PySpark and pyarrow.
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
    DmlResult,
    ExpireResult,
    LakehouseError,
    Retention,
    TableExistsError,
    TableNotFoundError,
    VersionNotFoundError,
    VersionVacuumedError,
)

if TYPE_CHECKING:
    from spark_integration.spark.cells import write_cells
    from spark_integration.spark.datasource import PercolakeDataSource, register
    from spark_integration.spark.lakehouse import Lakehouse
    from spark_integration.spark.session import s3a_conf

_LAZY = {
    "Lakehouse": "spark_integration.spark.lakehouse",
    "PercolakeDataSource": "spark_integration.spark.datasource",
    "register": "spark_integration.spark.datasource",
    "write_cells": "spark_integration.spark.cells",
    "s3a_conf": "spark_integration.spark.session",
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
    "DmlResult",
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
    "s3a_conf",
    "write_cells",
]
