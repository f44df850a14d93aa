"""Reads over several tables at once (issue 27): ``KVStore.get_latest_of_tables`` and
``Transaction.get_many_of_tables`` answer on every backend exactly as one read per table
would. A group commit reads its table's head and its job marks with them in one round;
the protocol's reads must not change with it: the same snapshot, the same resolution of
pending and committed writers, the same read set for a SERIALIZABLE commit.
"""

from __future__ import annotations

import pytest

from storage_adapters import MAX_TIMESTAMP, Cell, KVStore, VersionWrite
from txn import Isolation, TransactionManager
from txn.errors import TransactionAbortedError, TransactionConflictError

pytestmark = pytest.mark.contract


def test_latest_of_several_tables_match_one_call_per_table(store: KVStore) -> None:
    # Enough cells in "a" that a networked store splits them over several requests.
    store.put_versions("a", [VersionWrite(b"r%02d" % i, b"c", 10, b"a%d" % i) for i in range(20)])
    store.put_versions("a", [VersionWrite(b"r00", b"c", 12, b"newer")])
    store.put_versions(
        "b", [VersionWrite(b"r00", b"c", 4, b"b"), VersionWrite(b"r00", b"c", 6, None)]
    )
    store.put_versions("c", [VersionWrite(b"k", b"c", MAX_TIMESTAMP - 1, b"top")])
    reads = [
        ("a", [(b"r%02d" % i, b"c") for i in range(20)] + [(b"absent", b"c")]),
        ("b", [(b"r00", b"c"), (b"r01", b"c")]),  # a tombstone, and a cell never written
        ("c", [(b"k", b"c")]),
        ("empty", [(b"k", b"c")]),  # a table never written
        ("a", [(b"r00", b"c")]),  # a table twice: each answered on its own
        ("b", []),
    ]
    for below in (5, 11, 13, MAX_TIMESTAMP):
        got = store.get_latest_of_tables(reads, below)
        assert got == [store.get_latest(table, cells, below) for table, cells in reads]
    got = store.get_latest_of_tables(reads, MAX_TIMESTAMP)
    first = Cell(b"r00", b"c")
    assert len(got[0]) == 20 and got[0][first].value == b"newer"
    assert got[1][first].value is None  # tombstones are returned, as get_latest returns them
    assert got[3] == {} and got[4] == {first: got[0][first]}
    assert store.get_latest_of_tables([], 5) == []


def test_a_bad_argument_among_several_tables_is_refused(store: KVStore) -> None:
    with pytest.raises(ValueError):
        store.get_latest_of_tables([("good", [(b"r", b"c")]), ("bad name", [])], 5)
    with pytest.raises(TypeError):
        store.get_latest_of_tables([("good", [(b"r", "c")])], 5)  # type: ignore[list-item]


def _committed(tm: TransactionManager, writes: list[tuple[str, bytes, bytes | None]]) -> None:
    with tm.begin() as tx:
        for table, row, value in writes:
            if value is None:
                tx.delete(table, row, b"c")
            else:
                tx.put(table, row, b"c", value)
        tx.commit()


def test_a_transaction_reads_several_tables_as_it_reads_each(tm: TransactionManager) -> None:
    """Committed, deleted, missing, pending (written and locked, not committed),
    committed after the snapshot, and the reader's own writes: the multi-table read
    returns exactly what ``get_many`` of each table returns at the same snapshot."""
    _committed(tm, [("head", b"t1", b"h1"), ("marks", b"j1", b"1"), ("marks", b"j2", b"2")])
    _committed(tm, [("marks", b"j2", None), ("marks", b"j3", b"3"), ("head", b"t2", b"h2")])
    # A writer that wrote its versions and holds its locks, but has not committed.
    pending = tm.begin()
    pending.put("head", b"t1", b"c", b"pending")
    pending.put("marks", b"j1", b"c", b"pending")
    attempt = pending.committer()
    while attempt.next_step != "check":
        attempt.step()
    reader = tm.begin()
    # Committed after the reader's snapshot: invisible to it.
    _committed(tm, [("marks", b"j3", b"late"), ("head", b"t2", b"late")])
    reader.put("marks", b"own", b"c", b"mine")
    reader.delete("head", b"t2", b"c")
    reads: list[tuple[str, list[tuple[bytes, bytes]]]] = [
        ("head", [(b"t1", b"c"), (b"t2", b"c"), (b"t9", b"c")]),
        ("marks", [(b"j1", b"c"), (b"j2", b"c"), (b"j3", b"c"), (b"own", b"c"), (b"j9", b"c")]),
        ("nothing", [(b"x", b"c")]),
    ]
    got = reader.get_many_of_tables(reads)
    assert got == [reader.get_many(table, cells) for table, cells in reads]
    assert got == [
        {(b"t1", b"c"): b"h1"},
        {(b"j1", b"c"): b"1", (b"j3", b"c"): b"3", (b"own", b"c"): b"mine"},
        {},
    ]
    assert reader.get_many_of_tables([]) == []
    reader.abort()
    # The reader settled the pending writer (its lock outlived resolve_wait_ms): it
    # cannot commit any more, and its versions never show.
    with pytest.raises(TransactionAbortedError):
        attempt.run()
    with tm.begin() as check:
        assert check.get("head", b"t1", b"c") == b"h1"


def test_a_serializable_commit_validates_what_the_multi_table_read_returned(
    tm: TransactionManager,
) -> None:
    _committed(tm, [("head", b"t", b"h1"), ("marks", b"j", b"1")])
    reader = tm.begin(Isolation.SERIALIZABLE)
    head, marks = reader.get_many_of_tables([("head", [(b"t", b"c")]), ("marks", [(b"j", b"c")])])
    assert head == {(b"t", b"c"): b"h1"} and marks == {(b"j", b"c"): b"1"}
    _committed(tm, [("marks", b"j", b"2")])  # a cell the reader read changed meanwhile
    reader.put("out", b"r", b"c", b"v")
    with pytest.raises(TransactionConflictError):
        reader.commit()


def test_bad_reads_of_several_tables_are_refused(tm: TransactionManager) -> None:
    with tm.begin() as tx:
        with pytest.raises(TypeError, match="pairs"):
            tx.get_many_of_tables("head")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="pair"):
            tx.get_many_of_tables([("head",)])  # type: ignore[list-item]
        with pytest.raises(ValueError):
            tx.get_many_of_tables([("bad name", [(b"r", b"c")])])
