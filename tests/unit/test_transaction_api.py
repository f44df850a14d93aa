"""The transaction API of CONTRACT.md: validation, states, context manager, retries."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from txn import Isolation, TransactionManager, TransactionStatus
from txn.errors import (
    CommitUnknownError,
    TransactionAbortedError,
    TransactionClosedError,
    TransactionConflictError,
    TransactionError,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def mem() -> Iterator[TransactionManager]:
    manager = TransactionManager.embedded("memory://")
    yield manager
    manager.close()


def test_error_tree() -> None:
    assert issubclass(TransactionConflictError, TransactionAbortedError)
    assert issubclass(TransactionAbortedError, TransactionError)
    assert issubclass(CommitUnknownError, TransactionError)
    assert not issubclass(CommitUnknownError, TransactionAbortedError)
    assert issubclass(TransactionClosedError, TransactionError)


def test_ids_and_timestamps(mem: TransactionManager) -> None:
    a, b = mem.begin(), mem.begin()
    assert isinstance(a.id, str) and a.id != b.id
    assert b.start_ts > a.start_ts
    a.put("t", b"r", b"c", b"v")
    assert a.commit() > a.start_ts


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda tx: tx.put("bad table", b"r", b"c", b"v"), ValueError),
        (lambda tx: tx.put("", b"r", b"c", b"v"), ValueError),
        (lambda tx: tx.put("a" * 129, b"r", b"c", b"v"), ValueError),
        (lambda tx: tx.put(None, b"r", b"c", b"v"), TypeError),
        (lambda tx: tx.put("t", "r", b"c", b"v"), TypeError),
        (lambda tx: tx.put("t", b"", b"c", b"v"), ValueError),
        (lambda tx: tx.put("t", b"r", b"", b"v"), ValueError),
        (lambda tx: tx.put("t", b"r", b"c", "v"), TypeError),
        (lambda tx: tx.put("t", b"r", b"c", None), TypeError),
        (lambda tx: tx.delete("t", b"r", 3), TypeError),
        (lambda tx: tx.get("t", b"r", "c"), TypeError),
        (lambda tx: tx.get_many("t", [(b"r", "c")]), TypeError),
        (lambda tx: tx.get_many("t", (b"r", b"c")), TypeError),
        (lambda tx: tx.scan("t", "a"), TypeError),
        (lambda tx: tx.scan("t", b"a", "z"), TypeError),
    ],
)
def test_bad_input_is_refused_before_any_io(mem: TransactionManager, call, error) -> None:  # type: ignore[no-untyped-def]
    tx = mem.begin()
    with pytest.raises(error):
        call(tx)
    assert tx.status is TransactionStatus.ACTIVE  # the transaction is still usable
    tx.put("t", b"r", b"c", b"v")
    tx.commit()


def test_empty_value_is_a_value(mem: TransactionManager) -> None:
    with mem.begin() as tx:
        tx.put("t", b"r", b"c", b"")
    assert mem.begin().get("t", b"r", b"c") == b""


def test_bad_isolation_is_refused(mem: TransactionManager) -> None:
    with pytest.raises(TypeError):
        mem.begin("serializable")  # type: ignore[arg-type]


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_using_a_finished_transaction_is_an_error(mem: TransactionManager, end: str) -> None:
    tx = mem.begin()
    tx.put("t", b"r", b"c", b"v")
    getattr(tx, end)()
    for use in (
        lambda: tx.get("t", b"r", b"c"),
        lambda: tx.put("t", b"r", b"c", b"v"),
        lambda: tx.delete("t", b"r", b"c"),
        lambda: list(tx.scan("t")),
        tx.commit,
        tx.abort,
    ):
        with pytest.raises(TransactionClosedError):
            use()


def test_an_open_scan_stops_when_the_transaction_ends(mem: TransactionManager) -> None:
    with mem.begin() as tx:
        for i in range(5):
            tx.put("t", bytes([65 + i]), b"c", b"v")
    reader = mem.begin()
    rows = reader.scan("t")
    next(rows)
    reader.commit()
    with pytest.raises(TransactionClosedError):
        next(rows)


def test_context_manager_commits_or_aborts(mem: TransactionManager) -> None:
    with mem.begin() as tx:
        tx.put("t", b"a", b"c", b"1")
    assert tx.status is TransactionStatus.COMMITTED
    with pytest.raises(RuntimeError), mem.begin() as tx2:
        tx2.put("t", b"b", b"c", b"1")
        raise RuntimeError("job failed")
    assert tx2.status is TransactionStatus.ABORTED
    assert mem.begin().get("t", b"b", b"c") is None


def test_run_retries_conflicts_until_it_commits(mem: TransactionManager) -> None:
    with mem.begin() as tx:
        tx.put("t", b"n", b"c", b"0")

    def increment(tx):  # type: ignore[no-untyped-def]
        n = int(tx.get("t", b"n", b"c"))
        tx.put("t", b"n", b"c", str(n + 1).encode())
        return n + 1

    threads = [
        threading.Thread(target=lambda: [mem.run(increment, max_attempts=200) for _ in range(10)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mem.begin().get("t", b"n", b"c") == b"40"


def test_run_gives_up_after_max_attempts(mem: TransactionManager) -> None:
    attempts = []

    def always_conflicts(tx):  # type: ignore[no-untyped-def]
        attempts.append(tx.start_ts)
        raise TransactionConflictError("synthetic")

    with pytest.raises(TransactionConflictError):
        mem.run(always_conflicts, max_attempts=3)
    assert len(attempts) == 3
    with pytest.raises(ValueError):
        mem.run(always_conflicts, max_attempts=0)


def test_run_does_not_retry_other_errors(mem: TransactionManager) -> None:
    attempts = []

    def fails(tx):  # type: ignore[no-untyped-def]
        attempts.append(1)
        raise KeyError("bug")

    with pytest.raises(KeyError):
        mem.run(fails, isolation=Isolation.SERIALIZABLE)
    assert attempts == [1]


def test_attach_needs_a_remote_manager(mem: TransactionManager) -> None:
    with pytest.raises(TransactionError, match="remote"):
        mem.attach("123")


def test_closed_manager_refuses_new_transactions(mem: TransactionManager) -> None:
    mem.close()
    with pytest.raises(TransactionError):
        mem.begin()
    mem.close()  # idempotent


def test_embedded_manager_survives_a_restart_on_sqlite(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/p.db"
    with TransactionManager.embedded(url) as first:
        with first.begin() as tx:
            tx.put("t", b"r", b"c", b"durable")
        last_ts = tx.commit_ts
    with TransactionManager.embedded(url) as second:
        reader = second.begin()
        assert reader.start_ts > last_ts  # S7 across restarts
        assert reader.get("t", b"r", b"c") == b"durable"
