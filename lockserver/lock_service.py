"""The lock table as a gRPC service, and its client."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import grpc

from lockserver._table import MAX_LEASE_MS, LockTable, LockToken
from wire.channels import Connection, call, forwarded
from wire.error_codes import abort_with
from wire.v1 import lock_pb2 as pb
from wire.v1 import lock_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: Longest wait a caller may ask for in one call; longer waits hold server threads.
MAX_WAIT_MS = 60_000


class LockBackend(Protocol):
    """What holds the locks behind the servicer: a replica's control plane, which serves
    calls when leading and forwards them otherwise (never a call already forwarded)."""

    def lock(
        self,
        descriptors: Iterable[bytes],
        owner: str,
        lease_ms: int,
        wait_timeout_ms: int = 0,
        priority: int | None = None,
        *,
        forwarded: bool = False,
    ) -> LockToken | None: ...

    def refresh(
        self, token: LockToken, lease_ms: int | None = None, *, forwarded: bool = False
    ) -> bool: ...

    def unlock(self, token: LockToken, *, forwarded: bool = False) -> bool: ...

    def wait_until_released(
        self, descriptors: Iterable[bytes], timeout_ms: int, *, forwarded: bool = False
    ) -> bool: ...

    def epoch(self, *, forwarded: bool = False) -> int: ...


class _Alone:
    """A lone lock table (no replicas): every call is served here."""

    def __init__(self, table: LockTable) -> None:
        self._table = table

    def lock(
        self,
        descriptors: Iterable[bytes],
        owner: str,
        lease_ms: int,
        wait_timeout_ms: int = 0,
        priority: int | None = None,
        *,
        forwarded: bool = False,
    ) -> LockToken | None:
        return self._table.lock(descriptors, owner, lease_ms, wait_timeout_ms, priority)

    def refresh(
        self, token: LockToken, lease_ms: int | None = None, *, forwarded: bool = False
    ) -> bool:
        return self._table.refresh(token, lease_ms)

    def unlock(self, token: LockToken, *, forwarded: bool = False) -> bool:
        return self._table.unlock(token)

    def wait_until_released(
        self, descriptors: Iterable[bytes], timeout_ms: int, *, forwarded: bool = False
    ) -> bool:
        return self._table.wait_until_released(descriptors, timeout_ms)

    def epoch(self, *, forwarded: bool = False) -> int:
        return self._table.epoch


class LockServicer(pb_grpc.LockServiceServicer):
    def __init__(self, backend: LockTable | LockBackend) -> None:
        self._table = _Alone(backend) if isinstance(backend, LockTable) else backend

    def Lock(self, request: pb.LockRequest, context: grpc.ServicerContext) -> pb.LockResponse:
        try:
            _check_wait(request.wait_timeout_ms)
            token = self._table.lock(
                list(request.descriptors),
                request.owner,
                request.lease_ms,
                request.wait_timeout_ms,
                request.priority if request.HasField("priority") else None,
                forwarded=forwarded(context),
            )
        except Exception as exc:
            abort_with(context, exc)
        if token is None:
            return pb.LockResponse(acquired=False)
        if not context.is_active():
            # The caller went away while it waited (cancelled, its deadline passed, it
            # died): nobody will use or release this grant, which would otherwise hold
            # the lock, and everyone queued behind it, for a whole lease.
            try:
                self._table.unlock(token, forwarded=forwarded(context))
            except Exception as exc:  # nobody to tell: the lease runs out instead
                log.debug("could not release the grant of a caller that went away: %s", exc)
        return pb.LockResponse(acquired=True, token=_to_pb(token))

    def Refresh(
        self, request: pb.RefreshRequest, context: grpc.ServicerContext
    ) -> pb.RefreshResponse:
        try:
            lease = request.lease_ms if request.HasField("lease_ms") else None
            held = self._table.refresh(_from_pb(request.token), lease, forwarded=forwarded(context))
        except Exception as exc:
            abort_with(context, exc)
        return pb.RefreshResponse(held=held)

    def Unlock(self, request: pb.UnlockRequest, context: grpc.ServicerContext) -> pb.UnlockResponse:
        try:
            released = self._table.unlock(_from_pb(request.token), forwarded=forwarded(context))
        except Exception as exc:
            abort_with(context, exc)
        return pb.UnlockResponse(released=released)

    def WaitUntilReleased(
        self, request: pb.WaitUntilReleasedRequest, context: grpc.ServicerContext
    ) -> pb.WaitUntilReleasedResponse:
        try:
            _check_wait(request.timeout_ms)
            released = self._table.wait_until_released(
                list(request.descriptors), request.timeout_ms, forwarded=forwarded(context)
            )
        except Exception as exc:
            abort_with(context, exc)
        return pb.WaitUntilReleasedResponse(released=released)

    def GetEpoch(
        self, request: pb.GetEpochRequest, context: grpc.ServicerContext
    ) -> pb.GetEpochResponse:
        try:
            epoch = self._table.epoch(forwarded=forwarded(context))
        except Exception as exc:
            abort_with(context, exc)
        return pb.GetEpochResponse(epoch=epoch)


def _check_wait(wait_ms: int) -> None:
    if wait_ms > MAX_WAIT_MS:
        raise ValueError(f"wait must be at most {MAX_WAIT_MS} ms, got {wait_ms}")


def _to_pb(token: LockToken) -> pb.LockToken:
    return pb.LockToken(epoch=token.epoch, lock_id=token.lock_id)


def _from_pb(token: pb.LockToken) -> LockToken:
    return LockToken(token.epoch, token.lock_id)


class RemoteLockService:
    """The :class:`~txn._services.LockService` of a remote lock server."""

    def __init__(self, conn: Connection, timeout_s: float = 10.0) -> None:
        self._conn = conn
        self._stub = pb_grpc.LockServiceStub(conn.channel)
        self._timeout_s = timeout_s

    def _deadline(self, wait_ms: int) -> float:
        return self._timeout_s + wait_ms / 1000

    def lock(
        self,
        descriptors: Iterable[bytes],
        owner: str,
        lease_ms: int,
        wait_timeout_ms: int = 0,
        priority: int | None = None,
    ) -> LockToken | None:
        wanted = list(descriptors)
        if lease_ms > MAX_LEASE_MS or lease_ms < 0 or wait_timeout_ms < 0:
            raise ValueError("lease_ms and wait_timeout_ms must be within range")
        if priority is not None and not 0 <= priority < 2**64:
            raise ValueError(f"priority must be an unsigned 64-bit int or None, got {priority}")
        request = pb.LockRequest(
            descriptors=wanted,
            owner=owner,
            lease_ms=lease_ms,
            wait_timeout_ms=min(wait_timeout_ms, MAX_WAIT_MS),
        )
        if priority is not None:
            request.priority = priority
        got = call(self._stub.Lock, request, self._conn, self._deadline(wait_timeout_ms))
        return _from_pb(got.token) if got.acquired else None

    def refresh(self, token: LockToken, lease_ms: int | None = None) -> bool:
        request = pb.RefreshRequest(token=_to_pb(token))
        if lease_ms is not None:
            request.lease_ms = lease_ms
        return call(self._stub.Refresh, request, self._conn, self._timeout_s).held

    def unlock(self, token: LockToken) -> bool:
        request = pb.UnlockRequest(token=_to_pb(token))
        return call(self._stub.Unlock, request, self._conn, self._timeout_s).released

    def wait_until_released(self, descriptors: Iterable[bytes], timeout_ms: int) -> bool:
        request = pb.WaitUntilReleasedRequest(
            descriptors=list(descriptors), timeout_ms=min(timeout_ms, MAX_WAIT_MS)
        )
        got = call(self._stub.WaitUntilReleased, request, self._conn, self._deadline(timeout_ms))
        return got.released

    def epoch(self) -> int:
        return call(self._stub.GetEpoch, pb.GetEpochRequest(), self._conn, self._timeout_s).epoch
