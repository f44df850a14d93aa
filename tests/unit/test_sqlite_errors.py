"""SQLite failures reach callers as ``StoreError``s, and the adapter stays usable.

Before the fix, a raw ``sqlite3.OperationalError`` ("database is locked") escaped the
store. The commit path only handles ``StoreError``s, so the error also escaped the
committer's clean-up after recording nothing, before the committer's locks were
released: the next writer of the same cells waited for the whole lease.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from storage_adapters import (
    KVStore,
    StoreError,
    StoreTimeoutError,
    StoreUnavailableError,
    VersionWrite,
    open_store,
)
from storage_adapters.sqlite import SQLiteStore
from txn import TransactionConfig, TransactionManager
from txn.errors import TransactionAbortedError

pytestmark = pytest.mark.unit

#: Short enough that a locked database fails in milliseconds instead of 30 s.
BUSY_MS = 50


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def store(db: Path) -> Iterator[SQLiteStore]:
    opened = open_store(f"sqlite:///{db}?busy_timeout_ms={BUSY_MS}")
    assert isinstance(opened, SQLiteStore)
    yield opened
    opened.close()


def _write_lock(db: Path) -> sqlite3.Connection:
    """Another connection holding SQLite's write lock until it rolls back."""
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    return blocker


WRITES: dict[str, Callable[[KVStore], object]] = {
    "put_versions": lambda s: s.put_versions("t", [VersionWrite(b"r", b"c", 5, b"v")]),
    "delete_versions": lambda s: s.delete_versions("t", [(b"r", b"c", 1)]),
    "put_unless_exists": lambda s: s.put_unless_exists("_sys", b"k2", b"v"),
    "compare_and_set": lambda s: s.compare_and_set("_sys", b"k", b"v", b"w"),
}
READS: dict[str, Callable[[KVStore], object]] = {
    "get_latest": lambda s: s.get_latest("t", [(b"r", b"c")], 10),
    "scan": lambda s: list(s.scan("t", b"", None, 10)),
    "get_version_timestamps": lambda s: s.get_version_timestamps("t", [(b"r", b"c")]),
    "get_system": lambda s: s.get_system("_sys", [b"k"]),
}


def _seed(store: KVStore) -> None:
    store.put_versions("t", [VersionWrite(b"r", b"c", 1, b"v")])
    store.put_unless_exists("_sys", b"k", b"v")


@pytest.mark.parametrize("method", sorted(WRITES))
def test_a_locked_database_raises_store_unavailable_and_the_store_recovers(
    store: SQLiteStore, db: Path, method: str
) -> None:
    _seed(store)
    blocker = _write_lock(db)
    try:
        with pytest.raises(StoreUnavailableError, match="locked") as raised:
            WRITES[method](store)
        assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        assert not store._lock.locked()
        for read in READS.values():  # WAL readers are not blocked by the writer
            read(store)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    WRITES[method](store)  # works again once the other writer is gone


class _Failing:
    """A connection whose statements fail like a damaged file, except ROLLBACK."""

    def __init__(self, real: sqlite3.Connection, error: sqlite3.Error) -> None:
        self._real = real
        self._error = error

    def cursor(self) -> _Failing:
        return self

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.strip().upper() == "ROLLBACK":
            return self._real.execute(sql)
        raise self._error

    executemany = execute

    @property
    def in_transaction(self) -> bool:
        return self._real.in_transaction

    def close(self) -> None:
        self._real.close()


def _sqlite_error(kind: type[sqlite3.Error], message: str, code: int) -> sqlite3.Error:
    error = kind(message)
    error.sqlite_errorcode = code
    return error


@pytest.mark.parametrize("method", sorted({**WRITES, **READS}))
def test_every_method_wraps_sqlite_errors_and_releases_its_lock(
    store: SQLiteStore, method: str
) -> None:
    _seed(store)
    call = {**WRITES, **READS}[method]
    real = store._conn
    corrupt = _sqlite_error(sqlite3.DatabaseError, "database disk image is malformed", 11)
    store._conn = _Failing(real, corrupt)  # type: ignore[assignment]
    try:
        with pytest.raises(StoreError, match="malformed") as raised:
            call(store)
    finally:
        store._conn = real
    assert not isinstance(raised.value, StoreTimeoutError | StoreUnavailableError)
    assert raised.value.__cause__ is corrupt
    assert not store._lock.locked()
    call(store)  # the store still works


@pytest.mark.parametrize("method", sorted(WRITES))
def test_an_io_error_during_a_write_is_an_unknown_outcome(store: SQLiteStore, method: str) -> None:
    _seed(store)
    real = store._conn
    store._conn = _Failing(real, _sqlite_error(sqlite3.OperationalError, "disk I/O error", 10))  # type: ignore[assignment]
    try:
        with pytest.raises(StoreTimeoutError, match="I/O"):
            WRITES[method](store)
    finally:
        store._conn = real
    assert not store._lock.locked()


def test_a_commit_that_meets_a_locked_database_aborts_and_releases_its_locks(
    db: Path,
) -> None:
    """Before the fix: ``sqlite3.OperationalError`` out of ``commit`` and the locks held.

    The writer's versions fail (locked); recording its abort fails the same way. The
    raw error escaped the committer's clean-up before it released its locks, so the next
    writer of the same cell waited out ``lock_wait_ms`` and failed with a conflict.
    """
    config = TransactionConfig(lease_ms=60_000, lock_wait_ms=300)
    tm = TransactionManager.embedded(f"sqlite:///{db}?busy_timeout_ms={BUSY_MS}", config)
    try:
        tx = tm.begin()
        tx.put("t", b"r", b"c", b"first")
        blocker = _write_lock(db)
        try:
            with pytest.raises(TransactionAbortedError, match="locked"):
                tx.commit()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        with tm.begin() as again:  # the locks were released: no wait, no conflict
            again.put("t", b"r", b"c", b"second")
        with tm.begin() as check:
            assert check.get("t", b"r", b"c") == b"second"
    finally:
        tm.close()
