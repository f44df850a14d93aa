"""The gRPC side of the lakehouse: the gateway's ``LakehouseService`` and its client.

``servicer`` serves the engine's catalog over ``lakehouse.proto`` and hands commits
to ``group_commit``; ``client`` is the same catalog seen from a Spark driver or
executor through a gateway; ``convert`` turns engine objects into protobuf
messages and back for both.
"""

from __future__ import annotations

from spark_integration.service.client import RemoteCatalog
from spark_integration.service.group_commit import GroupCommitter, LakehouseLimits
from spark_integration.service.servicer import SERVICE_NAME, LakehouseServicer, serve_lakehouse

__all__ = [
    "SERVICE_NAME",
    "GroupCommitter",
    "LakehouseLimits",
    "LakehouseServicer",
    "RemoteCatalog",
    "serve_lakehouse",
]
