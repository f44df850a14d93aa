"""The one mapping between exceptions and gRPC status codes.

Errors cross the wire in exactly one pair of functions: :func:`status_for` turns an
exception into a status code and a machine-readable reason (trailing metadata
``percolake-reason``; the reasons are listed in ``proto/percolake/v1/*.proto``), and
:func:`error_from` turns a received error back into the same exception type, from the
error root :mod:`wire.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import grpc

from wire import errors as root
from wire.errors import TransactionError

log = logging.getLogger(__name__)

REASON_KEY = "percolake-reason"

# Reasons (see proto/percolake/v1/transaction.proto).
CONFLICT = "conflict"
#: A deadlock victim (a TransactionConflictError whose reason is "deadlock").
DEADLOCK = "deadlock"
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
        (root.DeadlockError, grpc.StatusCode.ABORTED, DEADLOCK),
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
        DEADLOCK: root.DeadlockError,
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


def reason_of(err: grpc.RpcError) -> str:
    """The ``percolake-reason`` trailer of a failed call ("" when it has none)."""
    if not isinstance(err, grpc.Call):
        return ""
    for key, value in err.trailing_metadata() or ():
        if key == REASON_KEY:
            return str(value)
    return ""
