"""The Spark data source ``percolake``: batch and streaming reads and writes of lakehouse tables.

``source`` is what Spark looks up (:class:`PercolakeDataSource`, and
:func:`register` for a session that did not find it by itself); ``options`` parses
what a reader or writer was given, ``files`` writes and reads the Parquet files,
``pruning`` skips files whose statistics rule out every row.
"""

from __future__ import annotations

from spark_integration.spark.datasource.source import PercolakeDataSource, register

__all__ = ["PercolakeDataSource", "register"]
