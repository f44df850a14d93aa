"""Fixtures shared by the integration tests of lakehouse statements."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.servers import ServerProcess

if TYPE_CHECKING:
    from spark_integration import Lakehouse


@pytest.fixture(scope="module")
def sqlite_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``percolake serve`` on SQLite for a module's tests; each test takes a
    catalog of its own on it (``lh``), so their tables never meet."""
    workdir = tmp_path_factory.mktemp("gateway")
    server = ServerProcess("all", ["--store", f"sqlite:///{workdir}/gw.db"], workdir).start()
    yield server
    server.stop()


@pytest.fixture(params=["embedded", "remote"])
def lh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lakehouse]:
    """A lakehouse on SQLite with a warehouse of its own: embedded, or through the
    module's gateway (its lakehouse service). Test files that need another mix define
    their own ``lh``; ``indirect`` parametrization picks one kind."""
    pytest.importorskip("pyspark")
    from spark_integration import Lakehouse
    from txn import TransactionConfig, TransactionManager

    catalog = f"c{os.urandom(6).hex()}"
    if request.param == "remote":
        gateway: ServerProcess = request.getfixturevalue("sqlite_gateway")
        remote = TransactionManager.remote(gateway.address)
        yield Lakehouse(remote, str(tmp_path / "warehouse"), catalog=catalog)
        remote.close()
        return
    config = TransactionConfig(resolve_wait_ms=300, lock_wait_ms=2000, settle_backoff_ms=1)
    manager = TransactionManager.embedded(f"sqlite:///{tmp_path}/store.db", config=config)
    yield Lakehouse(manager, str(tmp_path / "warehouse"), catalog=catalog)
    manager.close()
