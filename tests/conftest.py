"""Shared fixtures: one store factory per backend, parametrized for the contract tiers.

Adding a backend to every contract suite means adding one entry to ``STORE_BACKENDS``
(and, for a backend needing a server, a fixture that starts it).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage_adapters import KVStore, open_store
from txn import CONFLICTS, TransactionConfig, TransactionManager

pytest_plugins = [
    "tests.cassandra_plugin",
    "tests.cpu_plugin",
    "tests.s3_plugin",
    "tests.spark_plugin",
]

StoreFactory = Callable[[], KVStore]

_counter = itertools.count()

#: The JIT of every JVM the tests start (Cassandra nodes, the Spark driver, the JVMs of
#: chaos runs and launcher tests, in any child process): C1 only, one compiler thread.
#: The suite is CPU-bound on two cores, and C2 compiling code a short test runs a few
#: times cost a third of the JVMs' CPU: 70 -> 40 CPU-seconds for the store contract and
#: bank tests on one node, 94 -> 61 for the DML and change-feed tests (with the Spark
#: driver's serial GC, ``SPARK_TEST_CONF``). Behaviour is the same; only steady-state
#: speed differs, which is what benchmarks measure: ``make test-bench`` (``-m bench``)
#: keeps the JVMs' defaults, and so does a ``JAVA_TOOL_OPTIONS`` set by the caller.
TEST_JAVA_TOOL_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1"
    # Cassandra refreshes its approximate clock every 2 ms by default: an idle node
    # spent 2.9% of a core on that task alone (3.4 CPU-s per idle 90 s in all; 1.5 at
    # 20 ms), and a node of the session lives through the whole run. The clock serves
    # request timeouts and expiry, which the tests set in seconds. Other JVMs ignore it.
    " -Dcassandra.approximate_time_precision_ms=20"
)


def pytest_configure(config: pytest.Config) -> None:
    if (config.option.markexpr or "").strip() != "bench":
        os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JAVA_TOOL_OPTIONS)


@pytest.fixture(autouse=True)
def _uncontended_retries() -> None:
    """Each test starts with this process's retry backoff uncontended (``txn.CONFLICTS``):
    the conflicts of one test would otherwise widen the next test's backoff."""
    CONFLICTS.reset()


def _shared_jvm(item: pytest.Item) -> str | None:
    """The session JVM a test needs: ``cassandra`` (a node of tests/cassandra_plugin.py),
    ``spark`` (the session of tests/spark_plugin.py) or None.

    By the fixtures it uses, and by its parameters: ``store_url_factory`` and ``any_tm``
    reach the node through ``getfixturevalue``. Not by markers: a test marked
    ``cassandra`` that starts its own cluster (the launcher's tests, the bench runner)
    shares nothing and may run in any worker.
    """
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    if any(name.startswith("cassandra_") for name in names) or any(
        isinstance(value, str) and value.startswith("cassandra") for value in params
    ):
        return "cassandra"
    if names & {"spark", "spark_connect"}:
        # Two groups: the data source's batch tests take about as long as all the other
        # Spark tests, and the first worker free takes them (see below).
        if item.path.name == "test_datasource.py":
            return "spark-datasource"
        return "spark"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep each shared JVM in one pytest-xdist worker.

    xdist's worker turns each test's ``xdist_group`` mark into the ``@group`` suffix of
    its node id in its own ``pytest_collection_modifyitems``; ``tryfirst`` makes sure the
    marks are set before that. On pytest 9.2 the suffix is lost (pytest-xdist issue
    1386; pyproject.toml keeps pytest below 9.2): every worker then ran every group and
    started its own Cassandra nodes and Spark session, with nothing failing (found in
    the ``-v`` log of a run: one group's tests on every worker).
    ``tests/unit/test_xdist_groups.py`` checks that the groups hold.

    ``make test`` runs the suite in worker processes (``-n 2 --dist loadgroup``), and a
    session fixture lives once per worker. A test that needs a Cassandra node or the
    Spark session joins that JVM's group; every test of a group runs in one worker, so
    each node starts once per run, not once per worker (a node costs ~20 s of both
    cores to start). xdist hands the largest groups out first, one to each worker, and
    the rest to whichever worker runs low. The Spark tests form two groups, so that the
    worker that is free first takes the second: it reuses a session it already has (the
    Cassandra worker starts one for the lakehouse tests on Cassandra) or starts one.
    Without xdist the marks change nothing.
    """
    for item in items:
        group = _shared_jvm(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("cassandra", marks=pytest.mark.cassandra),
        # The server's default Paxos, which clusters in the field run (issue 18).
        pytest.param("cassandra-paxos-v1", marks=pytest.mark.cassandra),
    ]
)
def store_url_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """A callable that returns the URL of one store, the same store on every call.

    Calling it twice gives two handles on the same data: that is how tests restart
    a component on the same store.
    """
    backend: str = request.param
    if backend == "memory":
        # memory:// is per-handle; tests that reopen must skip memory themselves.
        return lambda: "memory://"
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/store-{next(_counter)}.db"
        return lambda: url
    fixture = "cassandra_store_url" if backend == "cassandra" else "cassandra_paxos_v1_store_url"
    url = request.getfixturevalue(fixture)
    return lambda: str(url)


@pytest.fixture
def store(store_url_factory: Callable[[], str]) -> Iterator[KVStore]:
    s = open_store(store_url_factory())
    yield s
    s.close()


# Short waits keep tests of stalled committers fast; none of these affects safety.
TEST_CONFIG_KW = {"resolve_wait_ms": 300, "lock_wait_ms": 2000, "settle_backoff_ms": 1}


@pytest.fixture
def tm(store_url_factory: Callable[[], str]) -> Iterator[TransactionManager]:
    """An embedded transaction manager on each backend."""
    manager = TransactionManager.embedded(
        store_url_factory(), config=TransactionConfig(**TEST_CONFIG_KW)
    )
    yield manager
    manager.close()


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("cassandra", marks=pytest.mark.cassandra),
        pytest.param("remote-sqlite", marks=pytest.mark.integration),
    ]
)
def any_tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    """A manager on each backend, and one through a real gateway process.

    Suites that use only the public API take this fixture, so that they run
    unchanged against ``TransactionManager.remote``.
    """
    kind: str = request.param
    if kind == "remote-sqlite":
        from tests.servers import ServerProcess

        server = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/gw.db"], tmp_path).start()
        manager = TransactionManager.remote(server.address)
        try:
            yield manager
        finally:
            manager.close()
            server.stop()
        return
    if kind == "cassandra":
        url = str(request.getfixturevalue("cassandra_store_url"))
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path}/any-{next(_counter)}.db"
    else:
        url = "memory://"
    embedded = TransactionManager.embedded(url, config=TransactionConfig(**TEST_CONFIG_KW))
    yield embedded
    embedded.close()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def warehouse(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A lakehouse warehouse no other test writes to: a local folder, or
    ``s3://<new bucket>/warehouse`` on the session's MinIO (tests/s3_plugin.py).

    Lakehouse suites take their warehouse from here so that each runs on both
    stores; a test that exercises only catalog logic narrows it to one with
    ``@pytest.mark.parametrize("warehouse", ["local"], indirect=True)``.
    """
    if request.param == "s3":
        return str(request.getfixturevalue("s3_warehouse"))
    return str(tmp_path / "warehouse")
