"""The lakehouse catalog as the data source reaches it: through a gateway, one connection per step.

Every driver-side step of a read or write (planning, ``commit``, ``abort``) runs in a
Python worker of its own and pickles what it hands on, so each step opens its own
connection for as long as it needs it and closes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql.types import StructType

from spark_integration.engine.model import TableMeta
from spark_integration.service import RemoteCatalog
from txn import TransactionManager
from txn.remote import RemoteTransactionManager
from wire.auth import resolve_token

#: The catalog ``Lakehouse`` uses by default: tables written here are its tables.
CATALOG = "lakehouse"


class GatewayCatalog(RemoteCatalog):
    """The catalog with the manager it runs on (``Lakehouse`` creates tables on it)."""

    def __init__(self, tm: RemoteTransactionManager) -> None:
        super().__init__(tm, CATALOG)
        self.manager = tm


@contextmanager
def open_gateway(address: str) -> Iterator[GatewayCatalog]:
    """The lakehouse catalog through the gateway at ``address``; token from ``$PERCOLAKE_TOKEN``."""
    tm = TransactionManager.remote(address, token=resolve_token())
    try:
        yield GatewayCatalog(tm)
    finally:
        tm.close()


def table_schema(meta: TableMeta, version: int | None = None) -> StructType:
    """The table's schema, or the one it had at ``version`` (time travel)."""
    raw = meta.schema_json if version is None else meta.schema_at(version)
    return StructType.fromJson(json.loads(raw))
