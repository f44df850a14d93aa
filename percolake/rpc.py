"""gRPC plumbing shared by every percolake service and client.

Errors cross the wire in exactly one pair of functions: :func:`status_for` turns an
exception into a status code and a machine-readable reason (trailing metadata
``percolake-reason``), and :func:`error_from` turns a received error back into the
same exception type. Everything else here is channels, servers, TLS and the bearer
token check.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, overload

import grpc

from percolake import errors as root
from percolake.errors import TransactionError

log = logging.getLogger(__name__)

REASON_KEY = "percolake-reason"
TOKEN_ENV = "PERCOLAKE_TOKEN"

#: Default cap on one message either way; larger requests get RESOURCE_EXHAUSTED.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Methods any caller may use without the token: load balancers and orchestrators
#: probe health without credentials. They reveal nothing but "serving".
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)

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


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and reason that carry ``exc`` over the wire."""
    table: list[tuple[type[BaseException], grpc.StatusCode, str]] = [
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
    context.set_trailing_metadata(((REASON_KEY, reason),))
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
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return UnauthenticatedError(message, code=code, reason=UNAUTHENTICATED)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(message)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
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
    # client itself (spark_integration._remote), which also bounds them by a deadline.
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
    """A channel to ``address`` with percolake's options: blocking, or ``grpc.aio``."""
    parse_address(address)
    options = channel_options(max_message_bytes)
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


# --- servers --------------------------------------------------------------------------


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
