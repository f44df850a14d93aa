"""Replica failover on the client side: :class:`ReplicaChannel`, one blocking channel
over several replicas of a service, which moves to the next replica that answers when
the one in use stops answering, and repeats a call there only when it is safe to
(rule S6: a commit is never sent twice).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from wire.error_codes import NO_LEADER, reason_of

log = logging.getLogger(__name__)

#: The calls that are safe to repeat: on UNAVAILABLE, by the channel's gRPC retry
#: policy, and on the next replica by :class:`ReplicaChannel`. Commit is never
#: repeated (rule S6); its outcome is settled with Status instead.
SAFE_TO_RETRY = [
    {"service": "percolake.v1.TimestampService"},
    {"service": "percolake.v1.LockService", "method": "Refresh"},
    {"service": "percolake.v1.LockService", "method": "Unlock"},
    {"service": "percolake.v1.LockService", "method": "WaitUntilReleased"},
    {"service": "percolake.v1.LockService", "method": "GetEpoch"},
    *(
        {"service": "percolake.v1.TransactionService", "method": m}
        for m in ("Begin", "Get", "GetMany", "Scan", "Write", "Abort", "Attach", "Status")
    ),
    # The lakehouse's reads. Its commits are idempotent by job id and re-sent by the
    # client itself (spark_integration.service.client), which also bounds them by a deadline.
    *(
        {"service": "percolake.v1.LakehouseService", "method": m}
        for m in ("GetTable", "ListTables", "ListFiles", "History", "PlanVacuum")
    ),
]

#: How often a client of replicas checks that the one it uses still answers, and how
#: long an answer may take; two missed answers in a row move it to the next replica.
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 1.0
PROBE_MISSES = 2

_HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def safe_to_retry(method: str) -> bool:
    """Whether a call of ``method`` (``/package.Service/Method``) may be sent again after
    it failed on a replica that stopped answering (the list of :data:`SAFE_TO_RETRY`)."""
    service, _, name = method.strip("/").partition("/")
    return any(
        entry["service"] == service and entry.get("method", name) == name for entry in SAFE_TO_RETRY
    )


class ReplicaChannel(grpc.Channel):
    """A blocking channel over several replicas (``h1:7070,h2:7070,h3:7070``).

    It uses one replica at a time, the first that answers a health check, and checks
    it every :data:`PROBE_INTERVAL_S`. When it stops answering (killed, paused, cut off)
    or a call finds it unavailable, the channel moves to the next replica that answers
    and closes the old channel, which cancels the calls still waiting on it. Calls that
    are safe to repeat (:data:`SAFE_TO_RETRY`) are sent again on the new replica
    within their deadline; any other call (a commit) fails, and its caller settles it
    (rule S6).

    ``open_replica`` opens a plain channel to one replica's address (with the TLS and
    options of the caller: :func:`wire.channels.open_channel` passes its own).
    """

    def __init__(self, addresses: list[str], open_replica: Callable[[str], grpc.Channel]) -> None:
        self._addresses = addresses
        self._open_replica = open_replica
        self._lock = threading.Lock()
        self._index = 0
        self._generation = 0
        self._current = open_replica(addresses[0])
        self._closed = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="percolake-replicas", daemon=True)
        self._monitor.start()

    @property
    def address(self) -> str:
        """The replica calls go to now."""
        return self._addresses[self._index]

    def current(self) -> tuple[int, grpc.Channel]:
        with self._lock:
            return self._generation, self._current

    # --- moving between replicas ---------------------------------------------------

    def _answers(self, channel: grpc.Channel) -> bool:
        check = channel.unary_unary(
            _HEALTH_CHECK,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        try:
            got = check(health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError:
            return False
        return bool(got.status == health_pb2.HealthCheckResponse.SERVING)

    def fail_over(self, generation: int) -> bool:
        """Move off the replica of ``generation`` to the next one that answers.

        Whether calls should go elsewhere now (another caller may have moved already).
        """
        with self._lock:
            if generation != self._generation:
                return True
            start = self._index
        for step in range(1, len(self._addresses)):
            index = (start + step) % len(self._addresses)
            candidate = self._open_replica(self._addresses[index])
            if self._answers(candidate):
                with self._lock:
                    if generation != self._generation or self._closed.is_set():
                        candidate.close()
                        return True
                    old, self._current = self._current, candidate
                    self._index, self._generation = index, self._generation + 1
                log.warning(
                    "replica %s stopped answering; calls go to %s",
                    self._addresses[start],
                    self._addresses[index],
                )
                old.close()  # cancels the calls still waiting on the old replica
                return True
            candidate.close()
        return False

    def _watch(self) -> None:
        misses = 0
        while not self._closed.wait(PROBE_INTERVAL_S):
            generation, channel = self.current()
            try:
                answered = self._answers(channel)
            except ValueError:  # closed under us
                continue
            misses = 0 if answered else misses + 1
            if misses >= PROBE_MISSES and self.fail_over(generation):
                misses = 0

    # --- grpc.Channel --------------------------------------------------------------

    def unary_unary(  # type: ignore[override]
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> _FailoverUnary:
        return _FailoverUnary(self, method, request_serializer, response_deserializer)

    def unary_stream(  # type: ignore[override]
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> _FailoverStream:
        return _FailoverStream(self, method, request_serializer, response_deserializer)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self.current()[1].stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self.current()[1].stream_stream(*args, **kwargs)

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self.current()[1].subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        self.current()[1].unsubscribe(callback)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            channel = self._current
        channel.close()

    def __enter__(self) -> ReplicaChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FailoverUnary:
    """A unary method of a :class:`ReplicaChannel`: sent to the current replica, and
    sent again on the next one when safe to repeat."""

    def __init__(
        self,
        parent: ReplicaChannel,
        method: str,
        serializer: Callable[[Any], bytes] | None,
        deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self._parent = parent
        self._method = method
        self._serializer = serializer
        self._deserializer = deserializer
        self._safe = safe_to_retry(method)

    def __call__(
        self, request: Any, timeout: float | None = None, metadata: Any = None, **kwargs: Any
    ) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            generation, channel = self._parent.current()
            call = channel.unary_unary(
                self._method,
                request_serializer=self._serializer,
                response_deserializer=self._deserializer,
            )
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return call(request, timeout=remaining, metadata=metadata, **kwargs)
            except ValueError:
                # "Cannot invoke RPC on closed channel": another call moved this channel to
                # the next replica before this one started; nothing was sent, so any call
                # may go to the new one.
                if self._parent.current()[0] == generation:
                    raise
                continue
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, grpc.Call) else None
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                if reason_of(err) == NO_LEADER:
                    # That replica waited the whole bound for a leader; asking the
                    # others would make the caller wait a multiple of the bound.
                    raise
                moved = self._parent.fail_over(generation)
                left = None if deadline is None else deadline - time.monotonic()
                if not self._safe or (left is not None and left <= pause):
                    raise
                if not moved:
                    time.sleep(pause)
                    pause = min(1.0, pause * 2)


class _FailoverStream:
    """A server-streaming method of a :class:`ReplicaChannel`, on the current replica
    (a stream is not resent: its caller pages again)."""

    def __init__(
        self,
        parent: ReplicaChannel,
        method: str,
        serializer: Callable[[Any], bytes] | None,
        deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self._parent = parent
        self._method = method
        self._serializer = serializer
        self._deserializer = deserializer

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        _, channel = self._parent.current()
        call = channel.unary_stream(
            self._method,
            request_serializer=self._serializer,
            response_deserializer=self._deserializer,
        )
        return call(request, **kwargs)
