"""Pytest plugin: one small local PySpark session for the whole test session.

``spark`` (session scope) is a ``local[2]`` SparkSession bound to 127.0.0.1 with
the UI off, two shuffle partitions and quiet logs; it is stopped when the
session ends. Tests that use it are skipped when pyspark is not installed or no
Java is found, and fail loudly when a session cannot start otherwise.

Register with ``pytest_plugins = ["tests.spark_plugin"]`` in ``tests/conftest.py``
(or ``-p tests.spark_plugin`` on the command line).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Settings that keep a test session small and private to this machine.
SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
    # Task failures are part of the tests: fail the job on the first one.
    "spark.task.maxFailures": "1",
    "spark.python.worker.reuse": "true",
}


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return True
    return shutil.which("java") is not None


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession shared by every test of the session."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (extra 'spark')")
    if not _java_available():
        pytest.skip("no Java found (set JAVA_HOME or put java on PATH)")
    from pyspark.sql import SparkSession

    # Python workers must run the interpreter the tests run in (the venv's).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    scratch = tmp_path_factory.mktemp("spark")
    builder = SparkSession.builder.master("local[2]").appName("percolake-tests")
    for key, value in SPARK_TEST_CONF.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
    builder = builder.config("spark.local.dir", str(scratch / "local"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
