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

import fcntl
import functools
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from spark_integration.engine.errors import LakehouseError

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
    """A ``local[2]`` session bound to loopback, quiet; ``conf`` adds or overrides settings.

    It reaches ``s3://`` tables too (:func:`s3a_conf`: the first session on a machine
    fetches the s3a jars, ~690 MB from Maven Central, once).
    """
    from pyspark.sql import SparkSession

    # Before the JVM starts: it fixes the workers' Python (and the interpreter that
    # looks up installed data sources such as pyspark_percolake) from this variable.
    os.environ.setdefault(PYSPARK_PYTHON, sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    settings = {**LOCAL_CONF, **s3a_conf(), **conf}
    for key, value in settings.items():
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


# --- S3 through s3a -------------------------------------------------------------------

#: The S3A connector, at the Hadoop version of PySpark's own client jars.
HADOOP_AWS = ("org.apache.hadoop", "hadoop-aws")

#: Where the s3a jars are kept: ``$PERCOLAKE_S3A_HOME`` or ``~/.cache/percolake/s3a``,
#: one folder per Hadoop version, shared by every clone and process on the machine.
S3A_HOME_VARIABLE = "PERCOLAKE_S3A_HOME"
DEFAULT_S3A_HOME = "~/.cache/percolake/s3a"

#: Written last into a version's folder: the jars it lists are complete.
_JARS_LIST = "jars.txt"

#: The credential chain s3a asks: the AWS SDK's default (system properties, the
#: ``AWS_*`` environment variables, web identity, the shared profiles, container and
#: instance roles). Hadoop's own default list leaves profiles out.
S3A_CREDENTIALS_PROVIDER = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"

#: Bounds on s3a's requests, as the file-system layer bounds pyarrow's: a paused or
#: unreachable store costs a bounded wait and a clear error, not Hadoop's defaults of
#: minutes of retries. A request may take up to two minutes (a 64 MB part on a slow
#: link); settings passed after these (the builder's own) win.
S3A_BOUNDS = {
    "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",
    "spark.hadoop.fs.s3a.connection.timeout": "30s",
    "spark.hadoop.fs.s3a.connection.request.timeout": "120s",
    "spark.hadoop.fs.s3a.attempts.maximum": "3",
    "spark.hadoop.fs.s3a.retry.limit": "3",
}

#: The Hadoop version in a client jar's name, ``hadoop-client-api-3.5.0.jar``.
_HADOOP_CLIENT_JAR = re.compile(r"hadoop-client-api-(\d+(?:\.\d+)+)\.jar")

#: One fetch at a time per process; other processes wait at the folder's file lock.
_fetch_lock = threading.Lock()


class S3ASetupError(LakehouseError, RuntimeError):
    """The s3a jars could not be found or fetched (no Java, no network, no pyspark)."""


def pyspark_jars_dir() -> Path:
    """The ``jars`` folder of the installed PySpark."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def hadoop_version() -> str:
    """The Hadoop version PySpark ships, read from its ``hadoop-client-api-*.jar``.

    hadoop-aws must match it exactly: the connector calls Hadoop internals that
    change between releases, and a mismatch fails only at the first ``s3a://`` use.
    """
    found = [
        match.group(1)
        for match in map(_HADOOP_CLIENT_JAR.fullmatch, os.listdir(pyspark_jars_dir()))
        if match
    ]
    if len(found) != 1:
        raise S3ASetupError(
            f"cannot tell PySpark's Hadoop version: expected one hadoop-client-api-*.jar "
            f"in {pyspark_jars_dir()}, found {found or 'none'}"
        )
    return found[0]


def s3a_home() -> Path:
    return Path(os.environ.get(S3A_HOME_VARIABLE) or DEFAULT_S3A_HOME).expanduser()


def s3a_jars(version: str | None = None) -> list[Path]:
    """The jars s3a needs (hadoop-aws and what its POM pulls: the AWS SDK bundle and
    the rest), fetched from Maven Central once per machine and Hadoop version.

    Fetched by Ivy, the resolver ``spark.jars.packages`` uses, run from the jar
    PySpark ships (``java -jar ivy-*.jar -dependency ...``): Maven's dependency rules
    (parent POMs, managed versions, scopes) are Ivy's to get right, not ours. Why not
    ``spark.jars.packages`` itself: in a Python application spark-submit also adds the
    resolved jars to ``spark.submit.pyFiles``, so every session copies the 686 MB SDK
    bundle into its temporary folder and every Python worker gets it on its path.
    """
    version = version or hadoop_version()
    folder = s3a_home() / f"hadoop-{version}"
    listed = _listed_jars(folder)
    if listed is not None:
        return listed
    with _fetch_lock:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".hadoop-{version}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching
            listed = _listed_jars(folder)
            if listed is None:
                _fetch_jars(version, folder)
                listed = _listed_jars(folder)
            if listed is None:
                raise S3ASetupError(f"fetching the s3a jars into {folder} left no {_JARS_LIST}")
            return listed


def _listed_jars(folder: Path) -> list[Path] | None:
    """The jars of a complete fetch into ``folder``; None when there is none."""
    try:
        names = (folder / _JARS_LIST).read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return None
    jars = [folder / name for name in names]
    return jars if jars and all(jar.is_file() for jar in jars) else None


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise S3ASetupError("no Java found to fetch the s3a jars (set JAVA_HOME)")
    return found


def _fetch_jars(version: str, folder: Path) -> None:
    ivy = sorted(pyspark_jars_dir().glob("ivy-*.jar"))
    if not ivy:
        raise S3ASetupError(f"no ivy-*.jar in {pyspark_jars_dir()} to fetch the s3a jars with")
    group, artifact = HADOOP_AWS
    staging = Path(tempfile.mkdtemp(prefix=f".hadoop-{version}-", dir=folder.parent))
    # Ivy's own cache would hold a second copy of every jar: a temporary one.
    cache = Path(tempfile.mkdtemp(prefix=".ivy-cache-", dir=folder.parent))
    try:
        command = [
            _java(),
            "-jar",
            str(ivy[-1]),
            "-dependency",
            group,
            artifact,
            version,
            "-confs",
            "default",
            "-types",
            "jar",
            "-cache",
            str(cache),
            "-retrieve",
            str(staging / "[artifact]-[revision](-[classifier]).[ext]"),
        ]
        log.info("fetching %s:%s:%s and its dependencies from Maven Central", *HADOOP_AWS, version)
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        names = sorted(p.name for p in staging.glob("*.jar"))
        if done.returncode != 0 or f"{artifact}-{version}.jar" not in names:
            raise S3ASetupError(
                f"fetching {group}:{artifact}:{version} from Maven Central failed "
                f"(exit {done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        (staging / _JARS_LIST).write_text("\n".join(names) + "\n", encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)  # a partial fetch of an older run
        os.rename(staging, folder)
        log.info(
            "fetched %d s3a jars into %s in %.0f s", len(names), folder, time.monotonic() - started
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def s3a_conf(
    environ: Mapping[str, str] | None = None, *, ship_jars: bool = False
) -> dict[str, str]:
    """The Spark settings that let Spark's own readers and writers reach ``s3a://``.

    From the standard AWS variables (``os.environ`` unless ``environ`` is given):
    ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` becomes ``fs.s3a.endpoint``, with
    path-style addressing (what S3-compatible servers such as MinIO serve) and SSL
    as its scheme says; ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``) becomes
    ``fs.s3a.endpoint.region``. Credentials are never copied into the conf (a Spark
    conf is shown in the UI and logs): s3a asks the AWS SDK's default chain, which
    reads the same variables, or the profiles, in each JVM.

    The jars (fetched first if this machine has none yet) go on the driver's and
    executors' class path by their paths in the local cache: right for a local
    session, whose executors are the driver's JVM, and for executors on machines
    with the same cache. ``ship_jars`` hands them to ``spark.jars`` instead, which
    ships them to executors anywhere, at a price: each executor copies all ~690 MB
    into its work folder when the session starts (measured +4.5 s per local session
    here, against +0.6 s on the class path). Settings only take effect in a JVM
    started with them: apply them to the builder of a new session.
    """
    env = os.environ if environ is None else environ
    jars = [str(jar) for jar in s3a_jars()]
    conf = {
        "spark.hadoop.fs.s3a.aws.credentials.provider": S3A_CREDENTIALS_PROVIDER,
        **S3A_BOUNDS,
    }
    if ship_jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.driver.extraClassPath"] = os.pathsep.join(jars)
        conf["spark.executor.extraClassPath"] = os.pathsep.join(jars)
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme = urlsplit(endpoint).scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"AWS endpoint {endpoint!r}: expected an http:// or https:// URL")
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(scheme == "https").lower()
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf
