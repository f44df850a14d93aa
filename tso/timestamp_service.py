"""The oracle as a gRPC service, and its batching client."""

from __future__ import annotations

from typing import Protocol

import grpc

from tso._batcher import TimestampBatcher
from tso._oracle import TimestampOracle, TimestampRange
from wire.channels import Connection, call, forwarded
from wire.error_codes import abort_with
from wire.v1 import timestamp_pb2 as pb
from wire.v1 import timestamp_pb2_grpc as pb_grpc

#: Largest range one call may take; a batch of that many callers is already huge.
MAX_RANGE = 1_000_000


class TimestampBackend(Protocol):
    """What serves timestamps behind the servicer: a replica's control plane, which
    serves them when leading and forwards them otherwise (never a call that was
    already forwarded)."""

    def next_range(self, count: int, *, forwarded: bool = False) -> TimestampRange: ...


class _Alone:
    """A lone oracle (no replicas): every call is served here."""

    def __init__(self, oracle: TimestampOracle) -> None:
        self._oracle = oracle

    def next_range(self, count: int, *, forwarded: bool = False) -> TimestampRange:
        return self._oracle.next_range(count)


class TimestampServicer(pb_grpc.TimestampServiceServicer):
    def __init__(self, backend: TimestampOracle | TimestampBackend) -> None:
        self._backend = _Alone(backend) if isinstance(backend, TimestampOracle) else backend

    def GetTimestamps(
        self, request: pb.GetTimestampsRequest, context: grpc.ServicerContext
    ) -> pb.GetTimestampsResponse:
        try:
            if not 1 <= request.count <= MAX_RANGE:
                raise ValueError(f"count must be in 1..{MAX_RANGE}, got {request.count}")
            got = self._backend.next_range(request.count, forwarded=forwarded(context))
        except Exception as exc:
            abort_with(context, exc)
        return pb.GetTimestampsResponse(first=got.first, count=got.count)


class RemoteTimestampSource:
    """Timestamps from a remote oracle; concurrent callers share one RPC (batching)."""

    def __init__(self, conn: Connection, timeout_s: float = 10.0) -> None:
        self._conn = conn
        self._stub = pb_grpc.TimestampServiceStub(conn.channel)
        self._timeout_s = timeout_s
        self._batcher = TimestampBatcher(self._fetch)

    def _fetch(self, count: int) -> TimestampRange:
        got = call(
            self._stub.GetTimestamps,
            pb.GetTimestampsRequest(count=count),
            self._conn,
            self._timeout_s,
        )
        if got.count != count:
            raise RuntimeError(f"oracle returned {got.count} timestamps, asked for {count}")
        return TimestampRange(got.first, got.count)

    def next_range(self, count: int) -> TimestampRange:
        if count > MAX_RANGE:
            raise ValueError(f"count must be at most {MAX_RANGE}, got {count}")
        return self._batcher.next_range(count)

    def next_timestamp(self) -> int:
        return self._batcher.next_timestamp()
