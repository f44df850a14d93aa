"""Driver failures as store errors (rule S6): ``translate_error`` and the LWT retry policy.

Kept apart from the store in :mod:`storage_adapters.cassandra` because these two decide
rule S6 (an unknown outcome is never reported as "not applied", and a conditional
write is never resent by the driver) and can be read and tested on their own, with
exceptions built by hand and no server. They need ``cassandra-driver``, for its
exception and policy types.
"""

from __future__ import annotations

from typing import Any

from cassandra import (
    CoordinationFailure,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteTimeout,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy, ConnectionException
from cassandra.policies import RetryPolicy
from cassandra.protocol import (
    ErrorMessage,
    IsBootstrappingErrorMessage,
    OverloadedErrorMessage,
    ServerError,
)

from wire.errors import StoreTimeoutError, StoreUnavailableError

__all__ = ["CAS_WRITE_UNKNOWN", "ConditionalWriteRetryPolicy", "never_sent", "translate_error"]

#: Protocol v5 error code: a Paxos proposal reached some replicas but not a majority.
CAS_WRITE_UNKNOWN = 0x1700


def translate_error(exc: BaseException, *, conditional_write: bool, write: bool) -> Exception:
    """The store error for a driver exception, or ``exc`` itself when it is a bug.

    ``conditional_write``: the request was a lightweight transaction, whose outcome
    matters (rule S6). ``write``: it could have changed data.
    """
    name = type(exc).__name__
    if conditional_write and (
        isinstance(exc, Unavailable) or getattr(exc, "code", None) == CAS_WRITE_UNKNOWN
    ):
        # With Paxos v1 (the server default) ``Unavailable`` can come from the commit
        # phase, after a majority accepted the proposal, and a later round completes
        # it; CAS_WRITE_UNKNOWN says outright that the proposal reached some replicas.
        # Either way the outcome is unknown, never "not applied" (rule S6).
        return StoreTimeoutError(f"Cassandra conditional write outcome unknown ({name}): {exc}")
    # Refused before anything was applied anywhere: safe to call "unavailable".
    if isinstance(
        exc, Unavailable | NoHostAvailable | OverloadedErrorMessage | IsBootstrappingErrorMessage
    ):
        return StoreUnavailableError(f"Cassandra unavailable ({name}): {exc}")
    # Sent, then lost: a write may or may not have been applied.
    if isinstance(
        exc,
        WriteTimeout
        | ReadTimeout
        | CoordinationFailure
        | OperationTimedOut
        | ConnectionException
        | ServerError,
    ):
        if write:
            kind = "conditional write" if conditional_write else "write"
            return StoreTimeoutError(f"Cassandra {kind} outcome unknown ({name}): {exc}")
        return StoreUnavailableError(f"Cassandra read failed ({name}): {exc}")
    if type(exc) is ErrorMessage:
        # A server error this driver has no class for (it decodes unknown codes as a
        # bare ErrorMessage): for a write nothing is known, so the outcome is unknown.
        if write:
            return StoreTimeoutError(f"Cassandra write outcome unknown (error {exc}): {exc}")
        return StoreUnavailableError(f"Cassandra read failed (error {exc}): {exc}")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


def never_sent(exc: BaseException) -> bool:
    """Whether the driver refused a request before sending it to any host.

    It raises ``NoHostAvailable`` of ``ConnectionBusy`` errors when every connection's
    socket buffer is full (a write of many megabytes still going out on it): the
    request never left this process, so sending it again is safe, even a write.
    """
    if not isinstance(exc, NoHostAvailable) or not exc.errors:
        return False
    return all(isinstance(e, ConnectionBusy) for e in exc.errors.values())


class ConditionalWriteRetryPolicy(RetryPolicy):  # type: ignore[misc]
    """Retry a conditional write only when Cassandra refused it before doing anything.

    ``Unavailable`` is retried once on another coordinator. With Paxos v2 it is raised
    before any proposal; with v1 it can also come after a majority accepted one, and
    then resending the same conditional write is still safe: it finds the row the
    first attempt wrote (put-unless-exists and compare-and-set callers take their own
    value as "applied"). Every other error leaves the outcome unknown and goes to the
    caller, who settles it by reading at SERIAL (rule S6). The default policy would
    also resend after a lost connection, turning one unknown outcome into two.
    """

    def on_read_timeout(self, *args: Any, **kwargs: Any) -> tuple[int, None]:
        return self.RETHROW, None

    def on_write_timeout(self, *args: Any, **kwargs: Any) -> tuple[int, None]:
        return self.RETHROW, None

    def on_unavailable(
        self,
        query: Any,
        consistency: Any,
        required_replicas: int,
        alive_replicas: int,
        retry_num: int,
    ) -> tuple[int, Any]:
        return (self.RETRY_NEXT_HOST, None) if retry_num == 0 else (self.RETHROW, None)

    def on_request_error(self, *args: Any, **kwargs: Any) -> tuple[int, None]:
        return self.RETHROW, None
