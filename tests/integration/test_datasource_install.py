"""``format("percolake")`` from a script outside the repository, as a user runs one.

Each test runs a script in a subprocess whose working directory is a temporary
folder, with the virtual environment's ``bin`` taken off ``PATH`` and no
``PYSPARK_PYTHON`` (the environment is not activated: ``python3`` on ``PATH`` is
another interpreter, without pyspark). The lookup tests run Spark's own lookup code
for installed data sources, on this environment's install (the editable one ``make``
makes) and on a wheel installed into a fresh environment; the last test runs a Spark
job (its own JVM) against a real gateway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tests.servers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
#: The packages a wheel holds (pyproject.toml's packages.find).
PACKAGES = (
    "percolake",
    "storage_adapters",
    "tso",
    "lockserver",
    "txn",
    "spark_integration",
    "pyspark_percolake",
    "wire",
)
SCRIPT_TIMEOUT_S = 240
PIP = (sys.executable, "-m", "pip", "-q")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("datasource_install")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/store.db"], workdir).start()
    try:
        yield server.address
    finally:
        server.stop()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _outside_env() -> dict[str, str]:
    """The environment of a user whose virtual environment is not activated."""
    venv_bin = os.path.dirname(sys.executable)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != venv_bin
    )
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


#: What both scripts share: a write from another thread, read back in a new session.
_COMMON = """
import json, sys, threading

def table_ids(session, table):
    df = session.read.format("percolake").option("gateway", GATEWAY).load(table)
    return sorted(r["id"] for r in df.select("id").collect())

def write(df, table, **options):
    writer = df.write.format("percolake").mode("append").option("gateway", GATEWAY)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(table)

def in_thread(fn):
    failure = []
    def run():
        try:
            fn()
        except Exception as exc:
            failure.append(repr(exc)[:2000])
    worker = threading.Thread(target=run)
    worker.start()
    worker.join(120)
    if failure:
        raise RuntimeError(failure[0])
"""


def _run(python: str, cwd: Path, script: str, gateway: str, warehouse: Path) -> dict[str, object]:
    path = cwd / "job.py"
    header = f"GATEWAY = {gateway!r}\nWAREHOUSE = {str(warehouse)!r}\n"
    path.write_text(header + _COMMON + textwrap.dedent(script))
    done = subprocess.run(
        [python, str(path)],
        cwd=cwd,
        env=_outside_env(),
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"the script failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    result: dict[str, object] = json.loads(lines[-1][len("RESULT ") :])
    return result


#: Spark's own lookup of installed Python data sources, as its worker runs it in each
#: JVM: the names it would register (a length-prefixed name after a count).
_LOOKUP = """
import io
from pyspark.sql.worker.lookup_data_sources import _main
out = io.BytesIO()
_main(None, out)
print("RESULT " + json.dumps({"percolake": b"\\x00\\x00\\x00\\tpercolake" in out.getvalue()}))
"""


def _wheel_python(tmp_path: Path) -> str:
    """A fresh environment with percolake installed from a wheel; its Python.

    Its other packages (pyspark, pyarrow, grpc...) are this environment's, named as a
    plain folder (the .pth files there, the editable install's among them, are not read).
    """
    # Built from a copy: a build writes build/ and *.egg-info next to the sources.
    source = _mkdir(tmp_path / "source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    python = str(venv / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    (wheel,) = wheels.glob("percolake-*.whl")
    subprocess.run(
        [*PIP, "install", "--no-deps", "--no-index", "--target", site, str(wheel)],
        check=True,
        capture_output=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.parametrize("install", ["editable", "wheel"])
def test_sparks_lookup_finds_the_installed_source_from_another_directory(
    install: str, tmp_path: Path
) -> None:
    """Issue 30 item 8. Fails before the fix for the editable install ``make`` makes:
    setuptools' default editable install is an import hook that ``pkgutil.iter_modules``
    (Spark's lookup of ``pyspark_*`` modules) never asks, so outside the repository
    root ``format("percolake")`` was ``DATA_SOURCE_NOT_FOUND``. Runs Spark's lookup
    worker code itself, from a temporary directory, for this environment's install and
    for a wheel in a fresh one (the JVM runs the same code in ``$PYSPARK_PYTHON``)."""
    python = sys.executable if install == "editable" else _wheel_python(tmp_path)
    assert _run(python, tmp_path, _LOOKUP, "unused:1", tmp_path) == {"percolake": True}


def test_register_reaches_new_sessions_and_threads_outside_the_repository(
    gateway: str, tmp_path: Path
) -> None:
    """Issue 30 item 8. Fails before the fix: in a session built with a plain
    ``SparkSession.builder`` while the environment is not activated, Spark ran the data
    source in ``python3`` from ``PATH`` (``ModuleNotFoundError``); a ``newSession()``
    did not have the registration; a DataFrame written from a thread other than the
    one that built the session was ``DATA_SOURCE_NOT_FOUND`` (Spark resolves a write's
    format in the JVM thread's active session, which that thread has none of)."""
    script = """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("install-test")
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from spark_integration import register
    register(spark)
    df = spark.createDataFrame([(i, f"d{i % 2}") for i in range(4)], "id BIGINT, day STRING")
    write(df, "t", createIfMissing="true", warehouse=WAREHOUSE)
    in_thread(lambda: write(df.selectExpr("id + 10 AS id", "day"), "t"))
    fresh = spark.newSession()
    in_thread(lambda: write(fresh.createDataFrame([(20, "d0")], df.schema), "t"))
    ids, python = table_ids(fresh, "t"), spark.sparkContext.pythonExec
    print("RESULT " + json.dumps({"ids": ids, "python": python}))
    spark.stop()
    """
    got = _run(sys.executable, tmp_path, script, gateway, tmp_path / "warehouse")
    assert got == {"ids": [0, 1, 2, 3, 10, 11, 12, 13, 20], "python": sys.executable}
