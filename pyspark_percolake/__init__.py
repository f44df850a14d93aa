"""Lets Spark find ``format("percolake")`` by itself once percolake is installed.

PySpark looks up Python data sources in top-level modules named ``pyspark_*`` that
expose a ``DefaultSource`` (a ``DataSource`` subclass) and registers each under its
``name()``. The source itself is :mod:`spark_integration.spark.datasource`.
"""

from __future__ import annotations

from spark_integration.spark.datasource import PercolakeDataSource as DefaultSource

__all__ = ["DefaultSource"]
