"""Pytest plugin: one small local PySpark session for the whole test session.

``spark`` (session scope) is a ``local[2]`` SparkSession bound to 127.0.0.1 with
the UI off, two shuffle partitions and quiet logs; it is stopped when the
session ends. It reaches the worker's MinIO (``s3_server`` of tests/s3_plugin.py)
through s3a, with the settings ``s3a_conf`` derives from the AWS variables that
fixture exports, so every Spark test can read and write ``s3://`` tables.
``spark_connect`` (session scope) is a Spark Connect client session
on a Connect server that runs in ``spark``'s driver, as ``start-connect-server.sh``
would run it, on a free loopback port. Tests that use them are skipped when pyspark
is not installed or no Java is found, and fail loudly when a session cannot start
otherwise.

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

from percolake.tools.s3 import S3Server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

log = logging.getLogger(__name__)

#: The Spark Connect server's service object (Scala), from the jar pyspark ships.
CONNECT_SERVICE = "org.apache.spark.sql.connect.service.SparkConnectService"

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
    # With C1 only (tests/conftest.py), G1's concurrent threads were a further ~15% of
    # the CPU of the DML and change-feed tests on two cores.
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
}


#: The trigger of a streaming query a test leaves running between
#: ``processAllAvailable`` calls. Spark's default asks the source for new data every
#: 10 ms while it has none (a ``latestOffset`` call into the source's Python process and
#: a gateway round trip each time): 3.0 CPU-s per idle 5 s, taken from the writes the
#: test makes meanwhile, against 1.0 at 100 ms, which delays a micro-batch by at most
#: that much (issue 29).
STREAM_POLL_INTERVAL = "100 milliseconds"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fetch the s3a jars now if a selected test starts Spark and this machine has none.

    Here rather than in ``spark``: a first fetch moves ~690 MB from Maven Central
    (10 s to minutes), which a fixture's setup would count against the per-test
    timeout. xdist workers meet at the fetch's file lock, so one fetches. A fetch that
    fails is left to ``spark``, which fails the Spark tests with the reason.
    """
    if not any(
        {"spark", "spark_connect"} & set(getattr(item, "fixturenames", ()))
        for item in session.items
    ):
        return
    try:
        from spark_integration.spark.session import S3ASetupError, s3a_jars
    except ImportError:  # no pyspark: the Spark tests skip
        return
    try:
        s3a_jars()
    except S3ASetupError as exc:
        log.warning("fetching the s3a jars failed; the Spark tests will fail: %s", exc)


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return True
    return shutil.which("java") is not None


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession shared by every test of the session, on S3 too.

    ``s3_server`` has exported its AWS variables by now: ``s3a_conf`` takes the
    endpoint and region from them, and the JVM, started below, inherits the
    credentials through its environment.
    """
    pytest.importorskip("pyspark", reason="pyspark is not installed (extra 'spark')")
    if not _java_available():
        pytest.skip("no Java found (set JAVA_HOME or put java on PATH)")
    from pyspark.sql import SparkSession

    from spark_integration import s3a_conf

    # Python workers must run the interpreter the tests run in (the venv's).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    scratch = tmp_path_factory.mktemp("spark")
    builder = SparkSession.builder.master("local[2]").appName("percolake-tests")
    s3a = s3a_conf()
    assert s3a["spark.hadoop.fs.s3a.endpoint"] == s3_server.endpoint_url
    for key, value in {**SPARK_TEST_CONF, **s3a}.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
    builder = builder.config("spark.local.dir", str(scratch / "local"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_connect(spark: SparkSession) -> Iterator[ConnectSession]:
    """A Spark Connect session: a gRPC client of a Connect server in ``spark``'s JVM.

    ``SparkSession.builder.remote("local[2]")`` would start such a server too, but only
    in a process that has no SparkContext yet, and it switches the whole process to
    Connect mode (an environment variable every later ``SparkSession`` call reads).
    Starting the server on the shared context instead costs no second JVM and leaves
    the classic tests alone; the client talks to it over gRPC like any remote client.
    Everything the Connect session runs goes through the server: plans, the Python
    data sources it looks up, their Python workers.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    context = spark.sparkContext._jsc.sc()
    # Read by the service when it starts: a free port, loopback only.
    context.conf().set("spark.connect.grpc.binding.address", "127.0.0.1")
    context.conf().set("spark.connect.grpc.binding.port", "0")
    service = getattr(jvm, CONNECT_SERVICE)
    service.start(context)
    # The port is known only from the running server (a field of the Scala object).
    module = jvm.java.lang.Class.forName(CONNECT_SERVICE + "$").getField("MODULE$").get(None)
    port = int(module.server().getPort())
    log.info("Spark Connect server on 127.0.0.1:%d", port)
    session = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").create()
    try:
        yield session
    finally:
        session.stop()
        service.stop(getattr(service, "stop$default$1")(), getattr(service, "stop$default$2")())
