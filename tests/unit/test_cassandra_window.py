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

from storage_adapters import Cell, StoreTimeoutError, StoreUnavailableError, VersionWrite
from storage_adapters._cassandra_session import FollowUp, _send_window
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


# --- follow-ups: reads sent after the writes they must see (the conflict check's first
# read in the write round, docs/design/storage.md) ------------------------------------


class _ManualSession:
    """Futures finish only when the test says (``finish``); ``sent`` lists each request's
    statement and params, in the order sent, for a test thread to wait on."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, Any]] = []
        self.futures: list[_Future] = []
        self._cond = threading.Condition()

    def prepare(self, query: str) -> Any:
        return argparse.Namespace(query=query, is_idempotent=True)

    def execute_async(self, statement: Any, params: Any = None, **kwargs: Any) -> _Future:
        future = _Future()
        with self._cond:
            self.sent.append((statement, params))
            self.futures.append(future)
            self._cond.notify_all()
        return future

    def wait_sent(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.sent) >= count, timeout=5), (
                f"{len(self.sent)} requests sent, expected {count}"
            )

    def finish(
        self, index: int, rows: list[tuple[Any, ...]] | None = None, error: Any = None
    ) -> None:
        self.futures[index].finish(rows or [], error)


def _call(function: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``function`` on a thread; its result or exception lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(function())
        except BaseException as exc:  # handed to the test thread
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_follow_up_goes_out_once_its_own_prerequisites_succeeded() -> None:
    """Not after the slowest request of the call: the read of what requests 0 and 2
    wrote is sent while request 1 is still in flight, and its rows come last."""
    session = _ManualSession()
    store = CassandraStore._with_session("cassandra://127.0.0.1/fake", session)
    writes = _queries(store, 3)
    read = (store._stmts.version_ts_one, ("t", b"\x00\x00", -1, 9, 16))
    thread, out = _call(
        lambda: store._execute_all(
            writes, write=True, concurrency=8, after=[FollowUp(read, frozenset({0, 2}))]
        )
    )
    session.wait_sent(3)
    session.finish(2)
    time.sleep(0.05)  # a wrong window would send the read now
    assert len(session.sent) == 3
    session.finish(0)
    session.wait_sent(4)
    assert session.sent[3] == read and not session.futures[1].done
    session.finish(3, [(b"\x00\x00", 7)])
    session.finish(1)
    thread.join(5)
    assert out == [[[], [], [], [(b"\x00\x00", 7)]]]


def test_a_follow_up_of_a_failed_request_is_never_sent() -> None:
    session = _ManualSession()
    store = CassandraStore._with_session("cassandra://127.0.0.1/fake", session)
    read = (store._stmts.version_ts_one, ("t", b"\x00\x00", -1, 9, 16))
    thread, out = _call(
        lambda: store._execute_all(
            _queries(store, 2), write=True, concurrency=8, after=[FollowUp(read, frozenset({0}))]
        )
    )
    session.wait_sent(2)
    session.finish(0, error=_unavailable())
    session.finish(1)
    thread.join(5)
    assert isinstance(out[0], StoreUnavailableError)
    assert len(session.sent) == 2


def _written_key(statement: Any, params: Any) -> bytes | None:
    """The cell key a request writes a version of (``None``: an index row or a read)."""
    query = statement.query
    return params[1] if "INSERT INTO" in query and "cell_versions" in query else None


def _keys_read(session: _ManualSession) -> list[bytes]:
    return [params[1] for statement, params in session.sent if "SELECT" in statement.query]


def _read_back_in_order(monkeypatch: pytest.MonkeyPatch, *, broken: bool) -> None:
    """Writes of three cells finish one at a time, the last sent first; after each
    version lands, that cell's read must go out, and no read of a cell whose version
    has not landed may have gone out. ``broken``: every read sent with the writes."""
    session = _ManualSession()
    store = CassandraStore._with_session("cassandra://127.0.0.1/fake", session)
    # One request per row (a first replica of its own each), so the test sees each alone.
    monkeypatch.setattr(store, "_replica", lambda table, key: (table, key))
    monkeypatch.setattr(store, "_shard_replica", lambda table, shard: object())
    if broken:
        real = _send_window

        def eager(*args: Any, after: Any = (), **kwargs: Any) -> Any:
            now = [FollowUp(f.query, frozenset()) for f in after]
            return real(*args, after=now, **kwargs)

        monkeypatch.setattr("storage_adapters._cassandra_session._send_window", eager)
    cells = [(b"r%d" % i, b"c") for i in range(3)]
    writes = [("t", [VersionWrite(r, c, 10, b"v") for r, c in cells])]
    expected = len(store._write_queries(writes)[0])
    thread, out = _call(lambda: store.put_versions_read_back_of_tables(writes, limit=4))
    session.wait_sent(expected)
    landed: list[bytes] = []
    try:
        writes_sent = [i for i, (s, _) in enumerate(session.sent) if "SELECT" not in s.query]
        for index in reversed(writes_sent):
            early = set(_keys_read(session)) - set(landed)
            assert not early, f"read of {sorted(early)} sent before its version landed"
            session.finish(index)
            key = _written_key(*session.sent[index])
            if key is not None:
                landed.append(key)
                session.wait_sent(expected + len(landed))
                assert _keys_read(session) == landed  # this cell's read, and only it
    finally:
        for index, future in enumerate(session.futures):
            if not future.done:
                statement, params = session.sent[index]
                session.finish(index, [(params[1], 10)] if "SELECT" in statement.query else [])
        thread.join(5)
    assert len(landed) == 3
    assert out == [[{Cell(r, c): [10] for r, c in cells}]]


def test_each_cell_is_read_back_only_after_its_own_version_landed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule S2 per cell: the read of a cell's version timestamps goes out only once the
    request writing its version succeeded, and then at once."""
    _read_back_in_order(monkeypatch, broken=False)


def test_a_read_back_sent_with_the_writes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken build: reads not waiting for their writes (a conflict check that may
    read before its own version landed, which lets two writers miss each other)."""
    with pytest.raises(AssertionError, match="sent before its version landed"):
        _read_back_in_order(monkeypatch, broken=True)
