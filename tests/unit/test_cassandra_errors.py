"""Cassandra failures reach callers as store errors (rule S6), with no server.

Driver exceptions are built by hand and the store runs over a fake session: a timed-out
conditional write is an unknown outcome (``StoreTimeoutError``) and is never resent, a
refusal is ``StoreUnavailableError``, a bug passes through. Needs ``cassandra-driver``
(for its exception and policy types), not a running Cassandra.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

pytest.importorskip(
    "cassandra", reason="needs cassandra-driver (pip install 'percolake[cassandra]')"
)

from cassandra import (
    ConsistencyLevel,
    InvalidRequest,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteFailure,
    WriteTimeout,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy, ConnectionShutdown
from cassandra.policies import RetryPolicy, WriteType
from cassandra.protocol import ErrorMessage

from storage_adapters import (
    StoreTimeoutError,
    StoreUnavailableError,
    VersionWrite,
    open_store,
)
from storage_adapters._cassandra_errors import (
    CAS_WRITE_UNKNOWN,
    ConditionalWriteRetryPolicy,
    never_sent,
    translate_error,
)
from storage_adapters.cassandra import CassandraStore

pytestmark = pytest.mark.unit


def _write_timeout(write_type: int) -> WriteTimeout:
    return WriteTimeout(
        "timed out",
        consistency=ConsistencyLevel.SERIAL,
        required_responses=2,
        received_responses=1,
        write_type=write_type,
    )


@pytest.mark.parametrize(
    "exc",
    [
        _write_timeout(WriteType.CAS),
        _write_timeout(WriteType.SIMPLE),
        WriteFailure("failed", consistency=ConsistencyLevel.QUORUM, write_type=WriteType.CAS),
        OperationTimedOut("client timeout"),
        ConnectionShutdown("connection lost mid-request"),
    ],
)
def test_unknown_write_outcomes_become_store_timeout(exc: Exception) -> None:
    assert isinstance(translate_error(exc, conditional_write=True, write=True), StoreTimeoutError)


@pytest.mark.parametrize(
    "exc",
    [
        Unavailable(
            "down", consistency=ConsistencyLevel.QUORUM, required_replicas=2, alive_replicas=1
        ),
        NoHostAvailable("no host", {}),
    ],
)
def test_refusals_become_store_unavailable(exc: Exception) -> None:
    for write in (True, False):
        translated = translate_error(exc, conditional_write=False, write=write)
        assert isinstance(translated, StoreUnavailableError)


def test_unavailable_on_a_conditional_write_is_an_unknown_outcome() -> None:
    """Issue 18, item 4 (and issue 12, hole 6); failed before the fix. With Paxos v1 the
    commit phase can answer Unavailable after a majority accepted the proposal, and a
    later round completes it: "not applied" would be a lie."""
    exc = Unavailable(
        "down", consistency=ConsistencyLevel.SERIAL, required_replicas=2, alive_replicas=1
    )
    assert isinstance(translate_error(exc, conditional_write=True, write=True), StoreTimeoutError)


def test_cas_write_unknown_is_an_unknown_outcome() -> None:
    """Issue 18, item 4; failed before the fix: protocol v5 error 0x1700 (a proposal that
    reached some replicas but not a majority) arrives as a bare ErrorMessage, which
    passed through untranslated, so the commit point skipped settlement."""
    exc = ErrorMessage(CAS_WRITE_UNKNOWN, "CAS operation result is unknown", None)
    assert isinstance(translate_error(exc, conditional_write=True, write=True), StoreTimeoutError)


def test_a_server_error_the_driver_does_not_know_is_never_passed_through_raw() -> None:
    exc = ErrorMessage(0x1800, "some future error", None)
    assert isinstance(translate_error(exc, conditional_write=False, write=True), StoreTimeoutError)
    assert isinstance(
        translate_error(exc, conditional_write=False, write=False), StoreUnavailableError
    )


def test_failed_reads_become_store_unavailable() -> None:
    read_timeout = ReadTimeout("slow", consistency=ConsistencyLevel.SERIAL)
    for exc in (read_timeout, OperationTimedOut("slow")):
        assert isinstance(
            translate_error(exc, conditional_write=False, write=False), StoreUnavailableError
        )


def test_programming_errors_pass_through() -> None:
    exc = InvalidRequest("bad query")
    assert translate_error(exc, conditional_write=True, write=True) is exc


def test_no_server_means_store_unavailable() -> None:
    with pytest.raises(StoreUnavailableError, match="Unable to connect"):
        open_store("cassandra://127.0.0.1:1/ks?connect_timeout_s=1")


class _FakeResult(list[tuple[Any, ...]]):
    column_names = ("[applied]", "tbl", "key", "value")


class FakeSession:
    """Stands in for a driver session: prepares anything, fails or answers on execute."""

    def __init__(self, fail_with: Exception | None = None, answer: Any = None) -> None:
        self.fail_with = fail_with
        self.answer = answer
        self.executed: list[tuple[Any, Any]] = []

    def prepare(self, query: str) -> Any:
        return argparse.Namespace(query=query, is_idempotent=True)

    def execute(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        self.executed.append((statement.query, params))
        if self.fail_with is not None:
            raise self.fail_with
        return self.answer


def _fake_store(session: FakeSession) -> CassandraStore:
    return CassandraStore._with_session("cassandra://127.0.0.1/fake", session)


def test_timed_out_put_unless_exists_raises_store_timeout_and_is_not_retried() -> None:
    session = FakeSession(fail_with=_write_timeout(WriteType.CAS))
    store = _fake_store(session)
    with pytest.raises(StoreTimeoutError, match="conditional write"):
        store.put_unless_exists("_txn", b"7", b"commit:9")
    assert len(session.executed) == 1
    assert "IF NOT EXISTS" in session.executed[0][0]


def test_timed_out_compare_and_set_raises_store_timeout() -> None:
    session = FakeSession(fail_with=_write_timeout(WriteType.CAS))
    with pytest.raises(StoreTimeoutError):
        _fake_store(session).compare_and_set("_tso", b"bound", b"1", b"2")
    assert "IF value = ?" in session.executed[0][0]


def test_unavailable_conditional_write_raises_an_unknown_outcome() -> None:
    """Paxos v1 may have applied it (see translate_error): never "not applied"."""
    session = FakeSession(
        fail_with=Unavailable(
            "down", consistency=ConsistencyLevel.SERIAL, required_replicas=2, alive_replicas=1
        )
    )
    with pytest.raises(StoreTimeoutError):
        _fake_store(session).put_unless_exists("_txn", b"7", b"x")


def test_lost_put_unless_exists_reports_the_winner() -> None:
    session = FakeSession(answer=_FakeResult([(False, "_txn", b"7", b"aborted")]))
    result = _fake_store(session).put_unless_exists("_txn", b"7", b"commit:9")
    assert (result.applied, result.current) == (False, b"aborted")


def test_arguments_are_checked_before_any_io() -> None:
    session = FakeSession(fail_with=AssertionError("no I/O expected"))
    store = _fake_store(session)
    with pytest.raises(ValueError):
        store.put_versions("bad name", [])
    with pytest.raises(TypeError):
        store.put_unless_exists("t", "k", b"v")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 65535"):
        store.put_versions("t", [VersionWrite(b"r" * 70_000, b"c", 1, b"v")])
    with pytest.raises(TypeError):
        store.delete_versions("t", [(b"r", b"c")])  # type: ignore[list-item]
    assert session.executed == []


def test_conditional_write_retry_policy_retries_only_unavailable() -> None:
    policy = ConditionalWriteRetryPolicy()
    assert policy.on_unavailable(None, None, 2, 1, retry_num=0)[0] == RetryPolicy.RETRY_NEXT_HOST
    assert policy.on_unavailable(None, None, 2, 1, retry_num=1)[0] == RetryPolicy.RETHROW
    write_timeout = policy.on_write_timeout(None, None, WriteType.CAS, 2, 1, retry_num=0)
    assert write_timeout[0] == RetryPolicy.RETHROW
    error = policy.on_request_error(None, None, ConnectionShutdown("x"), retry_num=0)
    assert error[0] == RetryPolicy.RETHROW


class _BusyOnce(FakeSession):
    """The driver finds every connection's send buffer full once (a large write going out)."""

    def execute(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        if not self.executed:
            self.executed.append((statement.query, params))
            raise NoHostAvailable(
                "busy", {"127.0.0.1:9042": ConnectionBusy("Connection 127.0.0.1 is overloaded")}
            )
        return super().execute(statement, params, **kwargs)


def test_a_request_the_driver_could_not_send_is_sent_again() -> None:
    """Failed in CI before the fix: a 15 MiB write still going out filled the socket
    buffer, the driver refused the next request of the same put_versions with
    ConnectionBusy (nothing sent) and the store reported the whole write unavailable."""
    session = _BusyOnce(answer=[])
    store = _fake_store(session)
    # One write through the path every read and version write takes (a put_versions
    # sends two, the version and its index row, which a fake session cannot run
    # concurrently).
    store._execute_all([(store._stmts.insert_version, ("t", b"k", 7, b"v", False))], write=True)
    assert len(session.executed) == 2 and "INSERT" in session.executed[1][0]
    assert never_sent(NoHostAvailable("x", {"h": ConnectionBusy("busy")}))
    assert not never_sent(NoHostAvailable("x", {"h": ConnectionBusy("b"), "g": OSError("down")}))
