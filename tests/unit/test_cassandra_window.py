"""How the Cassandra store runs a call's concurrent requests (issue 27, round trips).

``CassandraConnection._execute_all`` sends a call's requests with ``execute_async`` in a
bounded window (``_send_window``). These tests drive it with a fake session whose
futures finish from another thread, and check what the sequential and
``execute_concurrent`` versions guaranteed: at most ``concurrency`` requests in
flight, nothing sent after a failure, no request still in flight when the call
raises, and errors mapped as one request's would be (rule S6: a write whose outcome
is unknown stays unknown, whatever another request of the call reported).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import pytest

pytest.importorskip("cassandra")

from cassandra import ConsistencyLevel, Unavailable, WriteTimeout, WriteType
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionBusy

from storage_adapters import StoreTimeoutError, StoreUnavailableError
from storage_adapters.cassandra import CassandraStore

pytestmark = pytest.mark.unit


class _Future:
    """A driver ``ResponseFuture`` stand-in, finished by ``finish`` from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[tuple[Any, Any]] = []
        self._outcome: tuple[list[tuple[Any, ...]] | None, BaseException | None] | None = None

    def add_callbacks(self, callback: Any, errback: Any) -> None:
        with self._lock:
            outcome = self._outcome
            if outcome is None:
                self._callbacks.append((callback, errback))
                return
        self._call(callback, errback, outcome)

    def finish(self, rows: list[tuple[Any, ...]] | None, error: BaseException | None) -> None:
        with self._lock:
            self._outcome = (rows, error)
            callbacks, self._callbacks = self._callbacks, []
        for callback, errback in callbacks:
            self._call(callback, errback, (rows, error))

    @staticmethod
    def _call(callback: Any, errback: Any, outcome: tuple[Any, BaseException | None]) -> None:
        rows, error = outcome
        if error is None:
            callback(rows)
        else:
            errback(error)

    @property
    def done(self) -> bool:
        return self._outcome is not None

    def result(self) -> list[tuple[Any, ...]]:
        assert self._outcome is not None and self._outcome[1] is None
        return self._outcome[0] or []


class _AsyncSession:
    """Prepares anything; ``execute_async`` returns a future that a finisher thread
    completes with ``outcomes[i]`` (rows, or an exception) for the i-th request sent.

    Without ``order`` the futures finish in the order sent. With ``order`` (request
    indices) the finisher first waits until ``len(order)`` requests were sent, then
    finishes them in that order: errors arrive in an order the test chooses, with no
    timing involved.
    """

    def __init__(self, outcomes: list[Any], order: list[int] | None = None) -> None:
        self.outcomes = outcomes
        self.order = order
        self.sent: list[Any] = []
        self.futures: list[_Future] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._cond = threading.Condition()
        threading.Thread(target=self._finisher, daemon=True).start()

    def prepare(self, query: str) -> Any:
        return argparse.Namespace(query=query, is_idempotent=True)

    def execute_async(self, statement: Any, params: Any = None, **kwargs: Any) -> _Future:
        future = _Future()
        with self._cond:
            self.sent.append(params)
            self.futures.append(future)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self._cond.notify_all()
        return future

    def _finish(self, index: int) -> None:
        outcome = self.outcomes[min(index, len(self.outcomes) - 1)]
        with self._cond:
            self.in_flight -= 1
            future = self.futures[index]
        if isinstance(outcome, BaseException):
            future.finish(None, outcome)
        else:
            future.finish([(index,)], None)

    def _finisher(self) -> None:
        if self.order is not None:
            with self._cond:
                self._cond.wait_for(lambda: len(self.sent) >= len(self.order or ()), timeout=10)
            for index in self.order:
                self._finish(index)
            return
        done = 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self._cond:
                if len(self.sent) == done:
                    self._cond.wait(timeout=0.5)
                ready = len(self.sent)
            for index in range(done, ready):
                self._finish(index)
            done = ready


def _store(session: _AsyncSession) -> CassandraStore:
    return CassandraStore._with_session("cassandra://127.0.0.1/fake", session)


def _queries(store: CassandraStore, count: int) -> list[tuple[Any, tuple[Any, ...]]]:
    return [
        (store._stmts.insert_version, ("t", i.to_bytes(2, "big"), 1, b"v", False))
        for i in range(count)
    ]


def _write_timeout() -> WriteTimeout:
    return WriteTimeout(
        "timed out",
        consistency=ConsistencyLevel.QUORUM,
        required_responses=1,
        received_responses=0,
        write_type=WriteType.BATCH,
    )


def _unavailable() -> Unavailable:
    return Unavailable(
        "down", consistency=ConsistencyLevel.QUORUM, required_replicas=2, alive_replicas=1
    )


def test_every_result_comes_back_in_request_order_within_the_window() -> None:
    session = _AsyncSession([None])
    store = _store(session)
    rows = store._execute_all(_queries(store, 40), write=True, concurrency=5)
    assert rows == [[(i,)] for i in range(40)]
    assert len(session.sent) == 40
    assert session.most_in_flight <= 5


def test_a_write_timeout_wins_over_an_earlier_unavailable() -> None:
    """The unavailable request was not applied, the timed-out one may have been: the
    call's outcome is unknown (StoreTimeoutError), not "unavailable", even though the
    refusal arrived first (execute_concurrent raised whichever came first)."""
    session = _AsyncSession([None, _write_timeout(), _unavailable()], order=[2, 0, 1])
    store = _store(session)
    with pytest.raises(StoreTimeoutError, match="outcome unknown") as raised:
        store._execute_all(_queries(store, 3), write=True, concurrency=3)
    assert isinstance(raised.value.__cause__, WriteTimeout)


def test_a_failed_read_is_unavailable_and_the_first_error_wins() -> None:
    session = _AsyncSession([_unavailable(), _write_timeout()], order=[1, 0])
    store = _store(session)
    with pytest.raises(StoreUnavailableError) as raised:
        store._execute_all(_queries(store, 2), write=False, concurrency=2)
    assert isinstance(raised.value.__cause__, WriteTimeout)  # it arrived first


def test_nothing_is_sent_after_a_failure_and_nothing_is_left_in_flight() -> None:
    """The committer cleans up after a failed write step: no request of that write may
    still be on its way when the call raises."""
    session = _AsyncSession([_unavailable(), None], order=[0, 1, 2])
    store = _store(session)
    with pytest.raises(StoreUnavailableError):
        store._execute_all(_queries(store, 30), write=True, concurrency=3)
    assert len(session.sent) == 3  # the first window; the failure stopped the rest
    assert all(future.done for future in session.futures)
    assert session.in_flight == 0


def test_requests_the_driver_could_not_send_are_sent_again() -> None:
    busy = NoHostAvailable("busy", {"127.0.0.1:9042": ConnectionBusy("overloaded")})
    session = _AsyncSession([busy, None])
    store = _store(session)
    started = time.monotonic()
    rows = store._execute_all(_queries(store, 3), write=True, concurrency=3)
    assert len(rows) == 3
    assert len(session.sent) == 6  # the whole call once more (its writes are idempotent)
    assert time.monotonic() - started < 5


def test_a_busy_connection_beside_a_timeout_is_not_resent_and_stays_unknown() -> None:
    busy = NoHostAvailable("busy", {"127.0.0.1:9042": ConnectionBusy("overloaded")})
    session = _AsyncSession([busy, _write_timeout()], order=[0, 1])
    store = _store(session)
    with pytest.raises(StoreTimeoutError):
        store._execute_all(_queries(store, 2), write=True, concurrency=2)
    assert len(session.sent) == 2
