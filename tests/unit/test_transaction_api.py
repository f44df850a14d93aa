"""The public transaction API (txn.Manager, txn.Transaction): checks, states, retries."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from lockserver import MAX_DESCRIPTOR_BYTES, LockTable
from storage_adapters import (
    MAX_CELL_KEY_BYTES,
    MAX_ROW_BYTES,
    MAX_VALUE_BYTES,
    CasResult,
    Cell,
    Claim,
    KVStore,
    ScanEntry,
    Version,
    VersionStamp,
    VersionWrite,
)
from storage_adapters.memory import MemoryStore
from tso import TimestampBatcher, TimestampOracle
from txn import (
    Isolation,
    Transaction,
    TransactionConfig,
    TransactionManager,
    TransactionStatus,
)
from txn import failpoints as fp
from txn._services import cell_lock
from txn.errors import (
    CommitUnknownError,
    TransactionAbortedError,
    TransactionClosedError,
    TransactionConflictError,
    TransactionError,
)
from txn.tables import ABORTED, TXN_TABLE, decode_outcome

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


# --- the store's limits hold at put and get time (issue 18 item 5) --------------------

_TOO_LONG = (b"r" * MAX_ROW_BYTES, b"cc")  # row + column one byte over MAX_CELL_KEY_BYTES
_EACH_65535 = (b"r" * 65_535, b"c" * 65_535)  # each part under the old per-part limit
_TOO_BIG = bytes(MAX_VALUE_BYTES + 1)


@pytest.mark.parametrize(
    ("call", "by_store"),
    [
        pytest.param(
            lambda tx: tx.put("t", *_TOO_LONG, b"v"),
            lambda s: s.put_versions("t", [VersionWrite(*_TOO_LONG, 1, b"v")]),
            id="put",
        ),
        pytest.param(
            lambda tx: tx.put("t", *_EACH_65535, b"v"),
            lambda s: s.put_versions("t", [VersionWrite(*_EACH_65535, 1, b"v")]),
            id="put-65535-each",
        ),
        pytest.param(
            lambda tx: tx.delete("t", *_TOO_LONG),
            lambda s: s.put_versions("t", [VersionWrite(*_TOO_LONG, 1, None)]),
            id="delete",
        ),
        pytest.param(
            lambda tx: tx.put("t", b"r", b"c", _TOO_BIG),
            lambda s: s.put_versions("t", [VersionWrite(b"r", b"c", 1, _TOO_BIG)]),
            id="value",
        ),
        pytest.param(
            lambda tx: tx.get("t", *_TOO_LONG),
            lambda s: s.get_latest("t", [_TOO_LONG], 1),
            id="get",
        ),
        pytest.param(
            lambda tx: tx.get_many("t", [(b"r", b"c"), _EACH_65535]),
            lambda s: s.get_latest("t", [(b"r", b"c"), _EACH_65535], 1),
            id="get-many",
        ),
    ],
)
def test_a_cell_the_store_cannot_hold_is_refused_before_it_is_buffered(
    mem: TransactionManager,
    call: Callable[[Transaction], object],
    by_store: Callable[[KVStore], object],
) -> None:
    """The store's own ``ValueError``, word for word, when the cell is put or read,
    with nothing buffered and the transaction still usable. Failed before: the memory
    store held such cells, so the transaction took them, and on Cassandra the commit
    then failed in its write step."""
    tx = mem.begin()
    with pytest.raises(ValueError) as refused:
        call(tx)
    assert tx.buffered_writes == 0 and tx.status is TransactionStatus.ACTIVE
    with pytest.raises(ValueError) as refused_by_store:
        by_store(mem.store)
    assert str(refused.value) == str(refused_by_store.value)
    tx.put("t", b"r", b"c", b"v")
    tx.commit()


def test_the_longest_storable_cell_commits_through_its_lock(mem: TransactionManager) -> None:
    """A commit locks each written cell, and a lock descriptor (table, row and column)
    holds at most 4,096 bytes, far below the 65,527 bytes of row + column a store
    holds. Failed before: such a put was buffered and every commit of it aborted in
    its lock step ("lock descriptor longer than 4096 bytes"). Long descriptors are now
    a digest (locks serve liveness only), so every storable cell can be written."""
    row = b"r" * (MAX_CELL_KEY_BYTES - 1)
    assert len(cell_lock("t", row, b"c")) <= MAX_DESCRIPTOR_BYTES
    assert cell_lock("t", row, b"c") != cell_lock("t", row[:-1] + b"s", b"c")
    with mem.begin() as tx:
        tx.put("t", row, b"c", b"v")
    assert mem.begin().get("t", row, b"c") == b"v"
    with pytest.raises(ValueError, match="row and column"):
        mem.begin().put("t", row + b"r", b"c", b"v")  # one byte over the store's limit


def test_the_largest_value_commits_and_any_scan_bound_works(mem: TransactionManager) -> None:
    """A value of ``MAX_VALUE_BYTES`` in the longest storable cell commits and reads
    back; scan bounds longer than any key are bounds, not refused."""
    row, column, value = b"r" * (MAX_CELL_KEY_BYTES - 1), b"c", bytes(MAX_VALUE_BYTES)
    with mem.begin() as tx:
        tx.put("t", row, column, value)
        assert list(tx.scan("t", b"", b"s" * (MAX_CELL_KEY_BYTES * 2))) == [(row, column, value)]
    reader = mem.begin()
    assert reader.get("t", row, column) == value
    assert [r[:1] for r, _, _ in reader.scan("t", b"q" * 100_000, b"s" * 100_000)] == [b"r"]


# --- the life of a version (issue 18 item 6) ------------------------------------------


class _RecordingStore(KVStore):
    """A memory store that logs, in call order, every version write and delete (when
    called) and every outcome the transactions table answers (when it answers)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.log: list[tuple[str, Any, Any]] = []
        self._lock = threading.Lock()

    def _record(self, kind: str, a: Any, b: Any) -> None:
        with self._lock:
            self.log.append((kind, a, b))

    def put_versions(self, table: str, versions: Sequence[VersionWrite]) -> None:
        self._record("put", table, [(v.row, v.column, v.ts) for v in versions])
        self.inner.put_versions(table, versions)

    def delete_versions(self, table: str, versions: Sequence[tuple[bytes, bytes, int]]) -> None:
        self._record("delete", table, list(versions))
        self.inner.delete_versions(table, versions)

    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> CasResult:
        result = self.inner.put_unless_exists(table, key, value)
        if table == TXN_TABLE and result.current is not None:
            self._record("outcome", key, decode_outcome(result.current))
        return result

    def get_latest(
        self, table: str, cells: Sequence[tuple[bytes, bytes]], below_ts: int
    ) -> dict[Cell, Version]:
        return self.inner.get_latest(table, cells, below_ts)

    def _scan(
        self,
        table: str,
        start_row: bytes,
        end_row: bytes | None,
        below_ts: int,
        start_column: bytes,
        page_size: int,
    ) -> Iterator[ScanEntry]:
        return self.inner.scan(
            table, start_row, end_row, below_ts, start_column=start_column, page_size=page_size
        )

    def get_version_timestamps(self, *args: Any, **kwargs: Any) -> dict[Cell, list[int]]:
        return self.inner.get_version_timestamps(*args, **kwargs)

    def get_versions(self, *args: Any, **kwargs: Any) -> dict[Cell, list[Version]]:
        return self.inner.get_versions(*args, **kwargs)

    def stamp_versions(self, table: str, stamps: Sequence[VersionStamp]) -> None:
        self.inner.stamp_versions(table, stamps)

    def tables(self) -> list[str]:
        return self.inner.tables()

    def delete_system(self, table: str, key: bytes, expected: bytes) -> CasResult:
        return self.inner.delete_system(table, key, expected)

    def compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> CasResult:
        return self.inner.compare_and_set(table, key, expected, value)

    def get_system(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return self.inner.get_system(table, keys)

    def claim(self, role: str) -> Claim:
        return self.inner.claim(role)

    def close(self) -> None:
        self.inner.close()


def _check_version_lives(log: list[tuple[str, Any, Any]]) -> tuple[int, int]:
    """Every delete of a version comes after its writer's ABORTED entry, and no write of
    a version comes after a delete of it. Returns (versions written, versions deleted)."""
    aborted: set[int] = set()
    deleted: set[tuple[object, bytes, bytes, int]] = set()
    written: set[tuple[object, bytes, bytes, int]] = set()
    for kind, a, b in log:
        if kind == "outcome" and b == ABORTED:
            aborted.add(int.from_bytes(a, "big"))
        elif kind == "put":
            for row, column, ts in b:
                assert (a, row, column, ts) not in deleted, f"version {ts} written after a delete"
                written.add((a, row, column, ts))
        elif kind == "delete":
            for row, column, ts in b:
                assert ts in aborted, f"version of {ts} deleted before {ts} was settled ABORTED"
                assert (a, row, column, ts) in written, f"version {ts} deleted before written"
                deleted.add((a, row, column, ts))
    return len(written), len(deleted)


def test_the_protocol_deletes_a_version_only_after_its_abort_and_never_rewrites_it() -> None:
    """The narrowed store contract (``KVStore`` class docstring) is all the protocol
    needs: a version is written once, by its owner, and deleted only after the owner's
    ABORTED entry exists, never written after that. Four ways to abort after writing:
    a write-write conflict, a reader settling a paused committer whose locks were lost
    (the reader deletes what it found, then the committer fails at its commit point
    and deletes again), a settle before the commit ran, and a failure after the write.

    An aborted transaction can still write: one settled ABORTED before its commit ran
    writes its versions in step 2 and learns of the abort only at its commit point.
    What it writes was never deleted (each version has one write, and a cleaner
    deletes only versions it found or its own after its put returned), so the
    contract holds; the commit then fails and its versions are removed."""
    store = _RecordingStore()
    config = TransactionConfig(resolve_wait_ms=50, lock_wait_ms=2000, settle_backoff_ms=1)
    tm = TransactionManager(
        store, TimestampBatcher(TimestampOracle(store).next_range), LockTable(), config
    )
    try:
        # 1. A write-write conflict: the later committer aborts after writing.
        first, second = tm.begin(), tm.begin()
        first.put("t", b"a", b"c", b"1")
        second.put("t", b"a", b"c", b"2")
        first.commit()
        with pytest.raises(TransactionConflictError):
            second.commit()

        # 2. A committer paused after its write loses its locks; a reader settles it.
        resume, reached = threading.Event(), threading.Event()
        paused = tm.begin()
        paused.put("t", b"b", b"c", b"paused")
        paused.put("u", b"b", b"c", b"paused")
        tm.failpoints.enable(fp.AFTER_WRITE, fp.pause(30, until=resume, reached=reached), times=1)
        outcome: list[BaseException | int] = []
        committer = threading.Thread(target=lambda: _commit_into(paused, outcome))
        committer.start()
        assert reached.wait(10)
        tm.replace_locks(LockTable())  # its lease is gone
        assert tm.begin().get("t", b"b", b"c") is None  # settles it ABORTED, queues the delete
        tm.wait_for_cleanup()
        resume.set()
        committer.join(10)
        assert isinstance(outcome[0], TransactionConflictError)

        # 3. Settled ABORTED (by a gateway's fence, an operator) before its commit ran.
        fenced = tm.begin()
        fenced.put("t", b"c", b"c", b"fenced")
        assert tm.outcome(fenced.id, settle=True) is TransactionStatus.ABORTED
        with pytest.raises(TransactionConflictError):
            fenced.commit()

        # 4. A failure after the write (the oracle, say): the committer aborts itself.
        failing = tm.begin()
        failing.put("t", b"d", b"c", b"failing")
        tm.failpoints.enable(
            fp.AFTER_CONFLICT_CHECK, fp.raise_error(lambda: RuntimeError("oracle down")), times=1
        )
        with pytest.raises(TransactionAbortedError):
            failing.commit()

        tm.wait_for_cleanup()
        paused_deletes = [
            e
            for e in store.log
            if e[:2] == ("delete", "t") and (b"b", b"c", paused.start_ts) in e[2]
        ]
        assert len(paused_deletes) == 2  # by the reader while it was paused, then by itself
        written, deleted = _check_version_lives(store.log)
        assert (written, deleted) == (6, 5)  # every aborted version was deleted
        assert store.inner.get_version_timestamps(
            "t", [(b"a", b"c"), (b"b", b"c"), (b"c", b"c"), (b"d", b"c")]
        ) == {Cell(b"a", b"c"): [first.start_ts]}
        assert store.inner.get_version_timestamps("u", [(b"b", b"c")]) == {}
    finally:
        tm.close()


def _commit_into(tx: Transaction, outcome: list[BaseException | int]) -> None:
    try:
        outcome.append(tx.commit())
    except BaseException as exc:
        outcome.append(exc)
