"""Pytest plugin: one real S3 server (MinIO) per session, a fresh bucket per test.

``s3_server`` (session) starts MinIO through ``percolake.tools.s3`` in a temporary
directory on free loopback ports (building the binary into the shared cache the first
time, ~10 min on 2 cores; later starts take 1-2 s) and stops it when the session ends.
It also exports the server's AWS variables (``S3Server.env()``) into ``os.environ``
for the session, so gateways and writer processes the tests start reach it with the
standard AWS settings and nothing else. Under pytest-xdist each worker has its own
server: it starts fast enough that sharing one through an xdist group would cost more
than it saves.

``s3_bucket`` (function) is the name of a new, empty bucket; ``s3_warehouse`` is
``s3://<new bucket>/warehouse``. A server that cannot start fails the tests, loudly:
S3 is the medium percolake exists for, never an optional extra of the suite.

Tests that pause or kill MinIO start their own ``S3Server`` in ``tmp_path``; the
session's server is shared, and ``s3_bucket`` fails a test that finds it down.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator

import pytest

from percolake.tools.s3 import S3Error, S3Server, ensure_minio, minio_present

log = logging.getLogger(__name__)

#: The fixtures that reach the session's server; a test using one is marked ``s3``.
S3_FIXTURES = frozenset({"s3_server", "s3_bucket", "s3_warehouse"})

# Starting takes 1-2 s on a quiet machine; a worker that also runs Spark and Cassandra
# can be starved for far longer, and a slow start is not the failure tests look for.
STARTUP_TIMEOUT_S = 120.0

_bucket_numbers = itertools.count()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the session's server ``s3`` (``-m "not s3"`` skips them).

    ``tryfirst``: before pytest's own hook deselects by ``-m``.
    """
    for item in items:
        if _uses_s3(item):
            item.add_marker(pytest.mark.s3)


def _uses_s3(item: pytest.Item) -> bool:
    return bool(S3_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build MinIO now if a selected test needs it and the cache is empty.

    Here rather than in ``s3_server``: a first build takes ~10 min on 2 cores, past
    the per-test timeout that a fixture's setup counts against. ``make test`` builds it
    beforehand (``make minio``); this covers a bare ``pytest`` on a fresh machine.
    xdist workers meet at the build's file lock, so one builds and the others wait.
    A build that fails is left to ``s3_server``, which fails the S3 tests with the
    reason, while the others run.
    """
    if minio_present() or not any(_uses_s3(item) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            "building MinIO from the Go module proxy for the S3 tests "
            "(~10 min on 2 cores, once per machine; make minio does it ahead)"
        )
    try:
        ensure_minio()
    except S3Error as exc:
        log.warning("MinIO build failed; the S3 tests will fail: %s", exc)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real MinIO on 127.0.0.1 for the session, its AWS variables in ``os.environ``."""
    server = S3Server(tmp_path_factory.mktemp("s3"), startup_timeout_s=STARTUP_TIMEOUT_S)
    server.start()  # an S3Error fails every test that needs the server, naming why
    saved = {name: os.environ.get(name) for name in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """The name of a new, empty bucket on the session's server.

    ``pl-<worker>-<n>``: unique across pytest-xdist workers as well as within one.
    """
    if not s3_server.ready():
        pytest.fail(
            f"the session's MinIO ({s3_server.endpoint_url}) does not answer: an earlier test "
            "paused or killed it; tests that inject faults must start their own S3Server"
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return s3_server.create_bucket(f"pl-{worker}-{next(_bucket_numbers)}")


@pytest.fixture
def s3_warehouse(s3_bucket: str) -> str:
    """``s3://<new bucket>/warehouse``: a warehouse URL no other test writes to."""
    return f"s3://{s3_bucket}/warehouse"
