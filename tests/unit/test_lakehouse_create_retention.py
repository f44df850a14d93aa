"""A table's retention travels in the Lakehouse service's ``CreateTable`` (issue 17).

The servicer's ``CreateTable`` checks the request's retention at the edge (a negative,
NaN or infinite value is ``INVALID_ARGUMENT``, naming the field, and creates nothing)
and writes it in the transaction that creates the table; a request without one gets
the defaults. These tests call the servicer's method directly on an embedded manager;
``tests/integration/test_lakehouse_create_retention.py`` goes through ``percolake serve``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

import grpc
import pytest

from spark_integration import Retention
from spark_integration.engine import Catalog
from spark_integration.engine.model import Layout
from spark_integration.engine.retention import COL_RETENTION
from spark_integration.service import LakehouseServicer
from spark_integration.service.convert import retention_from_pb, retention_to_pb
from txn import TransactionManager
from wire.error_codes import INVALID_ARGUMENT, REASON_KEY
from wire.v1 import lakehouse_pb2 as pb

pytestmark = pytest.mark.unit

CATALOG = "lakehouse"


class Aborted(Exception):
    """What :meth:`RecordingContext.abort` raises, as grpc's context does."""


class RecordingContext:
    """The two calls ``abort_with`` makes on a ``grpc.ServicerContext``, recorded."""

    def __init__(self) -> None:
        self.trailers: dict[str, str] = {}
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailers = dict(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        self.code, self.details = code, details
        raise Aborted(details)


@pytest.fixture
def tm() -> Iterator[TransactionManager]:
    manager = TransactionManager.embedded("memory://")
    yield manager
    manager.close()


@pytest.fixture
def servicer(tm: TransactionManager) -> Iterator[LakehouseServicer]:
    service = LakehouseServicer(tm)
    yield service
    service.shutdown()


def create_request(name: str, retention: pb.Retention | None = None) -> pb.CreateTableRequest:
    return pb.CreateTableRequest(
        catalog=CATALOG,
        meta=pb.TableMeta(name=name, schema_json="{}", location=f"/nowhere/{name}"),
        job_id=f"create-{name}",
        retention=retention,
    )


def test_the_wire_form_round_trips_and_checks() -> None:
    assert retention_to_pb(None) is None
    assert retention_from_pb(retention_to_pb(Retention(1.5, 0)) or pb.Retention()) == Retention(
        1.5, 0
    )
    with pytest.raises(ValueError, match="mark_retention_s must be finite and >= 0"):
        retention_from_pb(pb.Retention(log_retention_s=1, mark_retention_s=float("inf")))


def test_create_table_writes_the_requests_retention_in_its_transaction(
    servicer: LakehouseServicer, tm: TransactionManager
) -> None:
    context: Any = RecordingContext()
    reply = servicer.CreateTable(
        create_request("t", pb.Retention(log_retention_s=3600, mark_retention_s=60)), context
    )
    catalog = Catalog(tm, CATALOG)
    assert catalog.retention("t") == Retention(3600, 60)
    assert reply.HasField("commit_ts")
    # One transaction: the table's metadata and its retention have one version each,
    # written at the same (start) timestamp.
    row = Layout.name_row("t")
    stamps = tm.store.get_version_timestamps(
        f"{CATALOG}.tables", [(row, Layout.COL_META), (row, COL_RETENTION)]
    )
    assert len(stamps) == 2
    (meta_ts, retention_ts) = stamps.values()
    assert len(meta_ts) == 1
    assert meta_ts == retention_ts


def test_create_table_without_a_retention_gets_the_defaults(
    servicer: LakehouseServicer, tm: TransactionManager
) -> None:
    context: Any = RecordingContext()
    servicer.CreateTable(create_request("t"), context)
    assert Catalog(tm, CATALOG).retention("t") == Retention()
    row = Layout.name_row("t")
    assert tm.store.get_version_timestamps(f"{CATALOG}.tables", [(row, COL_RETENTION)]) == {}


@pytest.mark.parametrize(
    ("retention", "field"),
    [
        (pb.Retention(log_retention_s=-1, mark_retention_s=60), "log_retention_s"),
        (pb.Retention(log_retention_s=float("nan"), mark_retention_s=60), "log_retention_s"),
        (pb.Retention(log_retention_s=60, mark_retention_s=float("inf")), "mark_retention_s"),
        (pb.Retention(log_retention_s=60, mark_retention_s=float("-inf")), "mark_retention_s"),
    ],
)
def test_a_bad_retention_is_invalid_argument_and_creates_nothing(
    servicer: LakehouseServicer, tm: TransactionManager, retention: pb.Retention, field: str
) -> None:
    context = RecordingContext()
    with pytest.raises(Aborted):
        servicer.CreateTable(create_request("t", retention), context)  # type: ignore[arg-type]
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert context.trailers == {REASON_KEY: INVALID_ARGUMENT}
    assert f"table 't': retention.{field} must be finite and >= 0" in context.details
    assert Catalog(tm, CATALOG).list_tables() == []
    # Nothing of the refused request stayed: the same job creates the table now.
    servicer.CreateTable(create_request("t"), RecordingContext())  # type: ignore[arg-type]
    assert Catalog(tm, CATALOG).list_tables() == ["t"]
