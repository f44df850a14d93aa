"""Spark sessions on this machine: a small local one, and what ``register`` fixes in any.

Two things in PySpark make ``format("percolake")`` fail although percolake is
installed, and both are fixed here rather than left to each script:

- **Which Python runs the workers.** PySpark starts its Python workers with
  ``$PYSPARK_PYTHON``, else ``python3`` from ``PATH``: with a virtual environment that
  is not activated (``/path/venv/bin/python job.py``) that is another interpreter,
  without pyspark or percolake (``ModuleNotFoundError: spark_integration``). The JVM
  reads the variable once, when it starts (its lookup of installed data sources runs
  that interpreter); the Python side reads it into ``SparkContext.pythonExec`` (the
  interpreter of every function it hands the JVM, data sources included). So
  ``local_session`` sets it before the JVM starts, and ``register`` sets both for a
  session that already runs, unless the user chose an interpreter.
- **Sessions that do not see a registration.** ``spark.dataSource.register`` is per
  session: ``spark.newSession()`` has only what Spark's own lookup of ``pyspark_*``
  modules found when its JVM started. And a write by format name (``df.write.save``,
  ``writeStream.start``, ``readStream.load``) looks the source up in the JVM thread's
  *active* session, which a Python thread other than the one that built the session
  does not have (PySpark sets it only in ``getOrCreate`` and ``createDataFrame``): the
  write fails with ``DATA_SOURCE_NOT_FOUND`` whatever was registered.
  ``reach_every_session`` wraps those PySpark methods (once per process) so that new
  sessions get the source when Spark's lookup did not find it, and a thread that has
  no active session takes the session of the DataFrame or reader it uses, as
  ``createDataFrame`` would have set it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Settings that keep a local session small and private to this machine.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

#: The environment variable PySpark (and the JVM it starts) takes the workers' Python from.
PYSPARK_PYTHON = "PYSPARK_PYTHON"

#: Marks a PySpark method this module wrapped, so that wrapping happens once.
_WRAPPED = "__percolake_wrapped__"
_wrap_lock = threading.Lock()


def local_session(app_name: str, **conf: str) -> SparkSession:
    """A ``local[2]`` session bound to loopback, quiet; ``conf`` adds or overrides settings."""
    from pyspark.sql import SparkSession

    # Before the JVM starts: it fixes the workers' Python (and the interpreter that
    # looks up installed data sources such as pyspark_percolake) from this variable.
    os.environ.setdefault(PYSPARK_PYTHON, sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in {**LOCAL_CONF, **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def workers_run_this_python(spark: SparkSession) -> None:
    """Make the Python workers of ``spark`` (a classic session) run this interpreter.

    Only when the user chose none (``$PYSPARK_PYTHON`` unset): PySpark's default,
    ``python3`` from ``PATH``, is not this interpreter unless its environment is
    activated, and a worker must run the driver's Python version anyway. Functions
    handed to the JVM from now on (the data source ``register`` is about to hand it)
    take the interpreter from ``SparkContext.pythonExec``; the variable covers
    contexts started later in this process.
    """
    if os.environ.get(PYSPARK_PYTHON):
        return
    os.environ[PYSPARK_PYTHON] = sys.executable
    context = spark.sparkContext
    if context.pythonExec != sys.executable:
        log.info(
            "Spark's Python workers were to run %r; running %s (this interpreter)",
            context.pythonExec,
            sys.executable,
        )
        context.pythonExec = sys.executable


def reach_every_session(source: type[Any]) -> None:
    """Let every classic session of this process, and every thread, find ``source``.

    Wraps ``SparkSession.newSession`` (register ``source`` in the new session when
    Spark's lookup did not find it) and the three PySpark calls that look a source up
    by name in the JVM thread's active session (``DataFrameWriter.save``,
    ``DataStreamWriter.start``, ``DataStreamReader.load``: give a thread without one
    the session it is using). Idempotent; a Connect session needs none of it (its
    server resolves names in the client's session).
    """
    from pyspark.sql.readwriter import DataFrameWriter
    from pyspark.sql.session import SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamReader, DataStreamWriter

    name = source.name()

    def registering(new_session: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(new_session)
        def newSession(self: Any) -> Any:
            session = new_session(self)
            manager = session._jsparkSession.sessionState().dataSourceManager()
            if not manager.dataSourceExists(name):
                # Spark refuses a name that the thread's active session (the parent,
                # which has the source) resolves but the new session does not, as if
                # it named a JVM source: register with the new session active.
                sessions = session._get_j_spark_session_class(session._jvm)
                previous = sessions.getActiveSession()
                sessions.setActiveSession(session._jsparkSession)
                try:
                    session.dataSource.register(source)
                finally:
                    if previous.isDefined():
                        sessions.setActiveSession(previous.get())
                    else:
                        sessions.clearActiveSession()
            return session

        return newSession

    def activating(call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _activate(self._spark)
            return call(self, *args, **kwargs)

        return wrapper

    with _wrap_lock:
        for owner, method, wrap in (
            (SparkSession, "newSession", registering),
            (DataFrameWriter, "save", activating),
            (DataStreamWriter, "start", activating),
            (DataStreamReader, "load", activating),
        ):
            current = getattr(owner, method)
            if getattr(current, _WRAPPED, False):
                continue
            wrapped = wrap(current)
            setattr(wrapped, _WRAPPED, True)
            setattr(owner, method, wrapped)


def _activate(spark: Any) -> None:
    """Make ``spark`` the JVM thread's active session if the thread has none."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # not a classic session
        return
    sessions = spark._get_j_spark_session_class(jvm)
    if sessions.getActiveSession().isEmpty():
        sessions.setActiveSession(spark._jsparkSession)
