"""gRPC plumbing shared by every percolake service and client.

Errors cross the wire in exactly one pair of functions: :func:`status_for` turns an
exception into a status code and a machine-readable reason (trailing metadata
``percolake-reason``), and :func:`error_from` turns a received error back into the
same exception type. Everything else here is channels, servers, TLS and the bearer
token check.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, overload

import grpc
from grpc_health.v1 import health_pb2

from wire import errors as root
from wire.errors import TransactionError

log = logging.getLogger(__name__)

REASON_KEY = "percolake-reason"
#: Metadata on a call one replica forwards to the leader: never forwarded again.
FORWARDED_KEY = "percolake-forwarded"
TOKEN_ENV = "PERCOLAKE_TOKEN"

#: Default cap on one message either way; larger requests get RESOURCE_EXHAUSTED.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Methods any caller may use without the token: load balancers and orchestrators
#: probe health without credentials, and tools such as ``grpcurl`` first ask server
#: reflection for the health service's schema (with reflection refused, ``grpcurl ...
#: grpc.health.v1.Health/Check`` failed as unauthenticated). Health reveals whether a
#: service is serving; reflection the schemas, which ``proto/`` publishes anyway.
UNAUTHENTICATED_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
)

# Reasons (see proto/percolake/v1/transaction.proto).
CONFLICT = "conflict"
ABORTED = "aborted"
SNAPSHOT_TOO_OLD = "snapshot-too-old"
COMMIT_UNKNOWN = "commit-unknown"
UNKNOWN_TRANSACTION = "unknown-transaction"
TRANSACTION_CLOSED = "transaction-closed"
NOT_OWNER = "not-owner"
INVALID_ARGUMENT = "invalid-argument"
LIMIT_EXCEEDED = "limit-exceeded"
STALE_TOKEN = "stale-token"
ORACLE_FENCED = "oracle-fenced"
UNAUTHENTICATED = "unauthenticated"
UNAVAILABLE = "unavailable"
#: No replica led within the wait for a leader: the replica already waited the
#: documented bound, so the call is not repeated (see :data:`PUSHBACK_KEY`).
NO_LEADER = "no-leader"
#: The gateway is shutting down and admits no new transaction: go to another replica.
DRAINING = "draining"
INTERNAL = "internal"
# Reasons of the lakehouse service (see proto/percolake/v1/lakehouse.proto).
TABLE_NOT_FOUND = "table-not-found"
TABLE_EXISTS = "table-exists"
VERSION_NOT_FOUND = "version-not-found"
CONCURRENT_MODIFICATION = "concurrent-modification"


class RpcError(TransactionError):
    """A call failed for a reason with no more specific exception type."""

    def __init__(self, message: str, *, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class UnauthenticatedError(RpcError, root.UnauthenticatedError):
    """The bearer token was missing or wrong."""


class ServiceUnavailableError(RpcError, root.ServiceUnavailableError):
    """The service could not be reached; the call was not known to be applied."""


class NoLeaderError(ServiceUnavailableError):
    """No replica led the role within the wait for a leader; the message names why
    (``no leader for tso within 15 s: store unreachable: ...``)."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        reason: str = NO_LEADER,
    ) -> None:
        super().__init__(message, code=code, reason=reason)


class GatewayDrainingError(ServiceUnavailableError):
    """The gateway is draining (shutting down): it admits no new transaction, and the
    client begins it on another replica."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        reason: str = DRAINING,
    ) -> None:
        super().__init__(message, code=code, reason=reason)


#: gRPC's server push-back: a negative value tells the client's channel not to send
#: the call again (its retry policy would otherwise repeat an UNAVAILABLE answer).
PUSHBACK_KEY = "grpc-retry-pushback-ms"
#: Answers that repeating on the same server cannot change: a replica that found no
#: leader already waited the whole bound, and a draining one refuses every Begin.
_NOT_REPEATED = (NO_LEADER, DRAINING)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and reason that carry ``exc`` over the wire."""
    table: list[tuple[type[BaseException], grpc.StatusCode, str]] = [
        (NoLeaderError, grpc.StatusCode.UNAVAILABLE, NO_LEADER),
        (GatewayDrainingError, grpc.StatusCode.UNAVAILABLE, DRAINING),
        (root.ConcurrentModificationError, grpc.StatusCode.ABORTED, CONCURRENT_MODIFICATION),
        (root.TableNotFoundError, grpc.StatusCode.NOT_FOUND, TABLE_NOT_FOUND),
        (root.TableExistsError, grpc.StatusCode.ALREADY_EXISTS, TABLE_EXISTS),
        (root.VersionNotFoundError, grpc.StatusCode.OUT_OF_RANGE, VERSION_NOT_FOUND),
        (root.SnapshotTooOldError, grpc.StatusCode.ABORTED, SNAPSHOT_TOO_OLD),
        (root.TransactionConflictError, grpc.StatusCode.ABORTED, CONFLICT),
        (root.TransactionAbortedError, grpc.StatusCode.ABORTED, ABORTED),
        (root.CommitUnknownError, grpc.StatusCode.UNKNOWN, COMMIT_UNKNOWN),
        (root.TransactionNotFoundError, grpc.StatusCode.NOT_FOUND, UNKNOWN_TRANSACTION),
        (root.TransactionClosedError, grpc.StatusCode.FAILED_PRECONDITION, TRANSACTION_CLOSED),
        (root.NotTransactionOwnerError, grpc.StatusCode.FAILED_PRECONDITION, NOT_OWNER),
        (root.TransactionLimitError, grpc.StatusCode.RESOURCE_EXHAUSTED, LIMIT_EXCEEDED),
        (root.StaleTokenError, grpc.StatusCode.FAILED_PRECONDITION, STALE_TOKEN),
        (root.OracleFencedError, grpc.StatusCode.UNAVAILABLE, ORACLE_FENCED),
        (root.StoreError, grpc.StatusCode.UNAVAILABLE, UNAVAILABLE),
        (root.ServiceUnavailableError, grpc.StatusCode.UNAVAILABLE, UNAVAILABLE),
        (root.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED),
        (ValueError, grpc.StatusCode.INVALID_ARGUMENT, INVALID_ARGUMENT),
        (TypeError, grpc.StatusCode.INVALID_ARGUMENT, INVALID_ARGUMENT),
    ]
    for kind, code, reason in table:
        if isinstance(exc, kind):
            return code, reason
    return grpc.StatusCode.INTERNAL, INTERNAL


def abort_with(context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
    """End the call with the status that carries ``exc``."""
    code, reason = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("internal error serving a call", exc_info=exc)
    trailer: tuple[tuple[str, str], ...] = ((REASON_KEY, reason),)
    if reason in _NOT_REPEATED:
        trailer += ((PUSHBACK_KEY, "-1"),)
    context.set_trailing_metadata(trailer)
    context.abort(code, str(exc) or type(exc).__name__)
    raise AssertionError("unreachable")  # pragma: no cover - abort raises


def error_from(err: grpc.RpcError) -> Exception:
    """The exception a received error stands for (the inverse of :func:`status_for`)."""
    # Every error a call raises has code(), details() and trailing_metadata(): the
    # blocking API's are grpc.Call instances, grpc.aio's are AioRpcError.
    if not isinstance(err, grpc.Call | grpc.aio.AioRpcError):
        return RpcError(str(err), code=grpc.StatusCode.UNKNOWN, reason="unknown")
    code = err.code()
    message = err.details() or code.name
    reason = ""
    for metadatum in err.trailing_metadata() or ():
        if metadatum[0] == REASON_KEY:
            reason = str(metadatum[1])
    by_reason: dict[str, Callable[[str], Exception]] = {
        CONFLICT: root.TransactionConflictError,
        ABORTED: root.TransactionAbortedError,
        SNAPSHOT_TOO_OLD: root.SnapshotTooOldError,
        UNKNOWN_TRANSACTION: root.TransactionNotFoundError,
        TRANSACTION_CLOSED: root.TransactionClosedError,
        NOT_OWNER: root.NotTransactionOwnerError,
        LIMIT_EXCEEDED: root.TransactionLimitError,
        STALE_TOKEN: root.StaleTokenError,
        ORACLE_FENCED: root.OracleFencedError,
        INVALID_ARGUMENT: ValueError,
        CONCURRENT_MODIFICATION: root.ConcurrentModificationError,
        TABLE_NOT_FOUND: root.TableNotFoundError,
        TABLE_EXISTS: root.TableExistsError,
        VERSION_NOT_FOUND: root.VersionNotFoundError,
    }
    if reason in by_reason:
        return by_reason[reason](message)
    if reason == NO_LEADER:
        return NoLeaderError(message, code=code)
    if reason == DRAINING:
        return GatewayDrainingError(message, code=code)
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return UnauthenticatedError(message, code=code, reason=UNAUTHENTICATED)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(message)
    # CANCELLED: a client of replicas closed the channel of one that stopped answering.
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return ServiceUnavailableError(message, code=code, reason=reason or UNAVAILABLE)
    return RpcError(message, code=code, reason=reason or code.name.lower())


# --- configuration ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Server: certificate and key, optionally a CA that client certificates must chain to.
    Client: the CA to trust, optionally a client certificate and key (mutual TLS)."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        if not (self.cert_file and self.key_file):
            raise ValueError("TLS on a server needs both a certificate and a key file")
        pair = (_read(self.key_file), _read(self.cert_file))
        ca = _read(self.ca_file) if self.ca_file else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs its key file, and the other way round")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file) if self.ca_file else None,
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None,
        )


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc


def resolve_token(token: str | None = None, token_file: str | None = None) -> str | None:
    """The bearer token: given, else from a file, else ``$PERCOLAKE_TOKEN``, else none."""
    if token is not None and token_file is not None:
        raise ValueError("give a token or a token file, not both")
    if token_file is not None:
        token = _read(token_file).decode().strip()
        if not token:
            raise ValueError(f"token file {token_file} is empty")
    elif token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is not None and (not token.isprintable() or " " in token):
        raise ValueError("a token must be printable and contain no spaces")
    return token


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) with a port in 0..65535; ``ValueError`` otherwise."""
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT")
    host, _, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT with a port number")
    return host, int(port_text)


def parse_addresses(addresses: str) -> list[str]:
    """``HOST:PORT[,HOST:PORT...]``: one service, or replicas of one; ``ValueError`` naming
    the bad part otherwise."""
    if not isinstance(addresses, str) or not addresses.strip():
        raise ValueError("expected HOST:PORT or several, separated by commas")
    parts = [part.strip() for part in addresses.split(",")]
    if any(not part for part in parts):
        raise ValueError(f"invalid address list {addresses!r}: an empty entry")
    for part in parts:
        parse_address(part)
    if len(set(parts)) != len(parts):
        raise ValueError(f"invalid address list {addresses!r}: an address repeats")
    return parts


def _replica_target(addresses: list[str]) -> str:
    """One gRPC target for several replicas: ``ipv4:`` or ``ipv6:`` with every address
    (names resolved now), for the ``pick_first`` policy to fail over between."""
    resolved: list[tuple[int, str, int]] = []
    for address in addresses:
        host, port = parse_address(address)
        try:
            ip = ipaddress.ip_address(host)
            resolved.append((ip.version, str(ip), port))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ValueError(f"cannot resolve {host!r} in {address!r}: {exc}") from exc
        family, *_, sockaddr = min(infos, key=lambda info: info[0] != socket.AF_INET)
        resolved.append((4 if family == socket.AF_INET else 6, str(sockaddr[0]), port))
    versions = {version for version, _, _ in resolved}
    if len(versions) > 1:
        raise ValueError(f"replica addresses mix IPv4 and IPv6: {','.join(addresses)}")
    if versions == {6}:
        return "ipv6:" + ",".join(f"[{ip}]:{port}" for _, ip, port in resolved)
    return "ipv4:" + ",".join(f"{ip}:{port}" for _, ip, port in resolved)


# --- clients --------------------------------------------------------------------------

#: Retry UNAVAILABLE for calls that are safe to repeat. Commit is never retried
#: (rule S6); its outcome is settled with Status instead.
_RETRY = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
_SAFE_TO_RETRY = [
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
_SERVICE_CONFIG = json.dumps({"methodConfig": [{"name": _SAFE_TO_RETRY, "retryPolicy": _RETRY}]})


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _SERVICE_CONFIG),
        ("grpc.keepalive_time_ms", 30_000),
    ]


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata every call carries: the bearer token (``$PERCOLAKE_TOKEN`` if none)."""
    token = resolve_token(token)
    return (("authorization", f"Bearer {token}"),) if token else ()


@overload
def open_channel(
    address: str,
    tls: TlsConfig | None = ...,
    max_message_bytes: int = ...,
    *,
    aio: Literal[False] = ...,
) -> grpc.Channel: ...
@overload
def open_channel(
    address: str,
    tls: TlsConfig | None = ...,
    max_message_bytes: int = ...,
    *,
    aio: Literal[True],
) -> grpc.aio.Channel: ...
def open_channel(
    address: str,
    tls: TlsConfig | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    aio: bool = False,
) -> grpc.Channel | grpc.aio.Channel:
    """A channel to ``address`` with percolake's options: blocking, or ``grpc.aio``.

    Several addresses (``h1:7070,h2:7070``) are replicas: the channel uses the first
    that answers and, when it fails or stops answering pings, the next.
    """
    addresses = parse_addresses(address)
    options = channel_options(max_message_bytes)
    if len(addresses) > 1:
        if not aio:
            return ReplicaChannel(addresses, tls, max_message_bytes)
        # grpc.aio clients (the oracle's asyncio client) leave failover to pick_first.
        options += [("grpc.lb_policy_name", "pick_first")]
        address = _replica_target(addresses)
    credentials = None if tls is None else tls.channel_credentials()
    if aio:
        if credentials is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, credentials, options=options)
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


class Connection:
    """A channel plus the metadata every call carries (the bearer token)."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: TlsConfig | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.channel = open_channel(address, tls, max_message_bytes)
        self.address = address
        self.metadata = auth_metadata(token)

    def close(self) -> None:
        self.channel.close()


Response = TypeVar("Response")


def call(
    fn: Callable[..., Response], request: object, conn: Connection, timeout_s: float
) -> Response:
    """Make one unary call, turning a failure into the exception it stands for."""
    try:
        return fn(request, metadata=conn.metadata, timeout=timeout_s)
    except grpc.RpcError as err:
        raise error_from(err) from None


def stream(
    fn: Callable[..., Iterator[Response]], request: object, conn: Connection, timeout_s: float
) -> Iterator[Response]:
    """Make one server-streaming call; closing the iterator cancels the call."""
    responses = fn(request, metadata=conn.metadata, timeout=timeout_s)
    try:
        yield from responses
    except grpc.RpcError as err:
        raise error_from(err) from None
    finally:
        cancel = getattr(responses, "cancel", None)
        if cancel is not None:
            cancel()


# --- several replicas -----------------------------------------------------------------

#: How often a client of replicas checks that the one it uses still answers, and how
#: long an answer may take; two missed answers in a row move it to the next replica.
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 1.0
PROBE_MISSES = 2

_HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def _safe_to_retry(method: str) -> bool:
    """Whether a call of ``method`` (``/package.Service/Method``) may be sent again after
    it failed on a replica that stopped answering (the list of :data:`_SAFE_TO_RETRY`)."""
    service, _, name = method.strip("/").partition("/")
    return any(
        entry["service"] == service and entry.get("method", name) == name
        for entry in _SAFE_TO_RETRY
    )


class ReplicaChannel(grpc.Channel):
    """A blocking channel over several replicas (``h1:7070,h2:7070,h3:7070``).

    It uses one replica at a time, the first that answers a health check, and checks
    it every :data:`PROBE_INTERVAL_S`. When it stops answering (killed, paused, cut off)
    or a call finds it unavailable, the channel moves to the next replica that answers
    and closes the old channel, which cancels the calls still waiting on it. Calls that
    are safe to repeat (:data:`_SAFE_TO_RETRY`) are sent again on the new replica
    within their deadline; any other call (a commit) fails, and its caller settles it
    (rule S6).
    """

    def __init__(self, addresses: list[str], tls: TlsConfig | None, max_message_bytes: int) -> None:
        self._addresses = addresses
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._index = 0
        self._generation = 0
        self._current = open_channel(addresses[0], tls, max_message_bytes)
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
            candidate = open_channel(self._addresses[index], self._tls, self._max_message_bytes)
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
        self._safe = _safe_to_retry(method)

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
                if _reason_of(err) == NO_LEADER:
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


def _reason_of(err: grpc.RpcError) -> str:
    """The ``percolake-reason`` trailer of a failed call ("" when it has none)."""
    if not isinstance(err, grpc.Call):
        return ""
    for key, value in err.trailing_metadata() or ():
        if key == REASON_KEY:
            return str(value)
    return ""


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


# --- servers --------------------------------------------------------------------------


def forwarded(context: grpc.ServicerContext) -> bool:
    """Whether another replica forwarded this call (see :data:`FORWARDED_KEY`)."""
    return any(key == FORWARDED_KEY for key, _ in context.invocation_metadata() or ())


if TYPE_CHECKING:
    _Interceptor = grpc.ServerInterceptor
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor
    _Handler = grpc.RpcMethodHandler


class TokenInterceptor(_Interceptor):
    """Refuses every call without ``authorization: Bearer <token>`` before it runs."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        method = str(details.method)
        if method.startswith(UNAUTHENTICATED_PREFIXES):
            return continuation(details)
        presented = b""
        for metadatum in details.invocation_metadata or ():
            if metadatum[0] == "authorization":
                value = metadatum[1]
                presented = value.encode() if isinstance(value, str) else bytes(value)
        if hmac.compare_digest(presented, self._expected):
            return continuation(details)
        return _deny(continuation(details))


def _deny(handler: _Handler | None) -> _Handler:
    def refuse(request: object, context: grpc.ServicerContext) -> NoReturn:
        context.set_trailing_metadata(((REASON_KEY, UNAUTHENTICATED),))
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        raise AssertionError("unreachable")  # pragma: no cover

    if handler is not None and handler.response_streaming:
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.unary_stream_rpc_method_handler(refuse)
    if handler is not None and handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
