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
from cassandra.connection import ConnectionException
from cassandra.policies import RetryPolicy
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage, ServerError

from storage_adapters._base import StoreTimeoutError, StoreUnavailableError

__all__ = ["ConditionalWriteRetryPolicy", "translate_error"]


def translate_error(exc: BaseException, *, conditional_write: bool, write: bool) -> Exception:
    """The store error for a driver exception, or ``exc`` itself when it is a bug.

    ``conditional_write``: the request was a lightweight transaction, whose outcome
    matters (rule S6). ``write``: it could have changed data.
    """
    name = type(exc).__name__
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
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


class ConditionalWriteRetryPolicy(RetryPolicy):  # type: ignore[misc]
    """Retry a conditional write only when Cassandra refused it before doing anything.

    ``Unavailable`` is raised before any Paxos proposal, so another coordinator may
    try; every other error leaves the outcome unknown and goes to the caller, who
    settles it by reading at SERIAL (rule S6). The default policy would also resend
    after a lost connection, turning one unknown outcome into two.
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
