"""A table's retention is set by the Lakehouse service's ``CreateTable``, through a real
``percolake serve`` (issue 17): a remote ``Lakehouse`` creates a table with its
retention in one request (one transaction: no window where the table exists with the
defaults), a bad retention is refused with ``INVALID_ARGUMENT`` and leaves no table
behind, and a request without a retention (an older client) gets the defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_integration import Lakehouse, Retention
from spark_integration.engine.model import Layout
from spark_integration.engine.retention import COL_RETENTION
from spark_integration.service.client import RemoteCatalog
from storage_adapters import open_store
from tests.servers import ServerProcess
from txn import TransactionManager
from txn.remote import RemoteTransactionManager
from wire.error_codes import INVALID_ARGUMENT, REASON_KEY
from wire.v1 import lakehouse_pb2 as pb
from wire.v1 import lakehouse_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

SCHEMA = StructType([StructField("id", LongType()), StructField("day", StringType())])
CATALOG = "lakehouse"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A ``percolake serve`` on SQLite; ``(address, store url)``."""
    url = f"sqlite:///{tmp_path}/create.db"
    server = ServerProcess("all", ["--store", url], tmp_path).start()
    try:
        yield server.address, url
    finally:
        server.stop()


@pytest.fixture
def remote(gateway: tuple[str, str]) -> Iterator[RemoteTransactionManager]:
    tm = TransactionManager.remote(gateway[0], timeout_s=30)
    assert isinstance(tm, RemoteTransactionManager)
    yield tm
    tm.close()


@pytest.fixture
def stub(gateway: tuple[str, str]) -> Iterator[pb_grpc.LakehouseServiceStub]:
    channel = grpc.insecure_channel(gateway[0])
    yield pb_grpc.LakehouseServiceStub(channel)
    channel.close()


def table_cell_timestamps(url: str, name: str) -> dict[bytes, list[int]]:
    """column -> the timestamps of its versions, in the table's row of ``tables``."""
    store = open_store(url)
    try:
        row = Layout.name_row(name)
        found = store.get_version_timestamps(
            f"{CATALOG}.tables", [(row, Layout.COL_META), (row, COL_RETENTION)]
        )
    finally:
        store.close()
    return {cell.column: stamps for cell, stamps in found.items()}


def test_a_remote_lakehouse_creates_a_table_with_its_retention_in_one_transaction(
    gateway: tuple[str, str], remote: RemoteTransactionManager, tmp_path: Path
) -> None:
    lh = Lakehouse(remote, tmp_path / "warehouse")
    assert isinstance(lh._catalog, RemoteCatalog)  # through the service, not the cells
    lh.create_table("events", SCHEMA, "day", retention=Retention(3600, 60))
    lh.create_table("plain", SCHEMA)
    assert lh.retention("events") == Retention(3600, 60)
    assert lh.retention("plain") == Retention()
    # Another client reads the same.
    other = Lakehouse(remote, tmp_path / "warehouse")
    assert other.retention("events") == Retention(3600, 60)
    # The metadata and the retention were written by the same transaction: one
    # version each, at the same timestamp (a second transaction would write later).
    stamps = table_cell_timestamps(gateway[1], "events")
    assert len(stamps[Layout.COL_META]) == 1
    assert stamps[COL_RETENTION] == stamps[Layout.COL_META]
    assert COL_RETENTION not in table_cell_timestamps(gateway[1], "plain")


@pytest.mark.parametrize(
    ("log_s", "mark_s", "field"),
    [
        (-1.0, 60.0, "log_retention_s"),
        (float("nan"), 60.0, "log_retention_s"),
        (60.0, float("inf"), "mark_retention_s"),
    ],
)
def test_a_bad_retention_is_refused_and_leaves_no_table(
    stub: pb_grpc.LakehouseServiceStub,
    remote: RemoteTransactionManager,
    tmp_path: Path,
    log_s: float,
    mark_s: float,
    field: str,
) -> None:
    location = str(tmp_path / "warehouse" / "events")
    request = pb.CreateTableRequest(
        catalog=CATALOG,
        meta=pb.TableMeta(name="events", schema_json=SCHEMA.json(), location=location),
        job_id="create-events",
        retention=pb.Retention(log_retention_s=log_s, mark_retention_s=mark_s),
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.CreateTable(request, timeout=30)
    err: Any = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.trailing_metadata() or ()).get(REASON_KEY) == INVALID_ARGUMENT
    assert f"table 'events': retention.{field} must be finite and >= 0" in err.details()
    assert list(stub.ListTables(pb.ListTablesRequest(catalog=CATALOG), timeout=30).tables) == []
    lh = Lakehouse(remote, tmp_path / "warehouse")
    assert lh.list_tables() == []
    # The name is free: a good request creates the table.
    request.retention.CopyFrom(pb.Retention(log_retention_s=10, mark_retention_s=5))
    stub.CreateTable(request, timeout=30)
    assert lh.retention("events") == Retention(10, 5)


def test_a_request_without_a_retention_gets_the_defaults(
    stub: pb_grpc.LakehouseServiceStub, remote: RemoteTransactionManager, tmp_path: Path
) -> None:
    location = str(tmp_path / "warehouse" / "events")
    request = pb.CreateTableRequest(
        catalog=CATALOG,
        meta=pb.TableMeta(name="events", schema_json=SCHEMA.json(), location=location),
        job_id="create-events",
    )
    assert not request.HasField("retention")
    reply = stub.CreateTable(request, timeout=30)
    assert reply.HasField("commit_ts")
    lh = Lakehouse(remote, tmp_path / "warehouse")
    assert lh.list_tables() == ["events"]
    assert lh.retention("events") == Retention()


def test_a_gateway_that_drops_the_retention_gets_it_set_in_a_second_transaction(
    gateway: tuple[str, str],
    remote: RemoteTransactionManager,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older gateway ignores the field it does not know: the client finds the
    defaults on the new table and sets its retention as older clients did."""
    lh = Lakehouse(remote, tmp_path / "warehouse")
    catalog = lh._catalog
    assert isinstance(catalog, RemoteCatalog)
    send = catalog._stub.CreateTable

    def older_gateway(request: pb.CreateTableRequest, *args: Any, **kwargs: Any) -> Any:
        request.ClearField("retention")  # what a gateway without the field reads
        return send(request, *args, **kwargs)

    catalog._stub.CreateTable = older_gateway  # type: ignore[assignment]
    with caplog.at_level("WARNING", logger="spark_integration.service.client"):
        lh.create_table("events", SCHEMA, "day", retention=Retention(3600, 60))
    assert lh.retention("events") == Retention(3600, 60)
    assert "without its retention" in caplog.text
    stamps = table_cell_timestamps(gateway[1], "events")
    assert stamps[COL_RETENTION][0] > stamps[Layout.COL_META][0]  # the second transaction
