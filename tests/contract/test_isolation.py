"""Isolation tests named after the anomaly they forbid or allow (Adya, Hermitage).

Every test runs on every backend through the ``any_tm`` fixture, embedded and through a
gateway process. Snapshot isolation forbids G0, G1a, G1b, G1c, OTV, PMP, G-single and
lost update and allows write skew (G2-item); SERIALIZABLE forbids that too, phantoms
included.
"""

from __future__ import annotations

import pytest

from txn import Isolation, TransactionManager
from txn.errors import TransactionConflictError

pytestmark = pytest.mark.contract

T = "accounts"
X, Y, Z = b"x", b"y", b"z"
V = b"v"


def setup(tm: TransactionManager, **values: int) -> None:
    with tm.begin() as tx:
        for key, value in values.items():
            tx.put(T, key.encode(), V, str(value).encode())


def read(tx, key: bytes) -> int | None:  # type: ignore[no-untyped-def]
    raw = tx.get(T, key, V)
    return None if raw is None else int(raw)


def test_g0_dirty_write_first_committer_wins(any_tm: TransactionManager) -> None:
    setup(any_tm, x=0, y=0)
    t1, t2 = any_tm.begin(), any_tm.begin()
    t1.put(T, X, V, b"11")
    t2.put(T, X, V, b"12")
    t2.put(T, Y, V, b"22")
    t1.put(T, Y, V, b"21")
    t1.commit()
    with pytest.raises(TransactionConflictError):
        t2.commit()
    check = any_tm.begin()
    assert (read(check, X), read(check, Y)) == (11, 21)


def test_g1a_aborted_read(any_tm: TransactionManager) -> None:
    setup(any_tm, x=10)
    t1 = any_tm.begin()
    t1.put(T, X, V, b"101")
    t2 = any_tm.begin()
    assert read(t2, X) == 10
    t1.abort()
    assert read(t2, X) == 10
    assert read(any_tm.begin(), X) == 10


def test_g1a_reader_settles_a_crashed_writer_as_aborted(tm: TransactionManager) -> None:
    from txn import failpoints as fp

    setup(tm, x=10)
    writer = tm.begin()
    writer.put(T, X, V, b"666")
    tm.failpoints.enable(fp.AFTER_WRITE, fp.crash(), times=1)
    with pytest.raises(fp.SimulatedCrash):
        writer.commit()
    # The crashed writer's version is in the store but it never committed.
    tm.replace_locks(type(tm.locks)())  # its locks die with it
    assert read(tm.begin(), X) == 10
    assert tm._rt.resolver.read([writer.start_ts]) == {writer.start_ts: -1}


def test_g1b_intermediate_read(any_tm: TransactionManager) -> None:
    setup(any_tm, x=10)
    t1 = any_tm.begin()
    t1.put(T, X, V, b"101")
    t2 = any_tm.begin()
    assert read(t2, X) == 10
    t1.put(T, X, V, b"11")
    t1.commit()
    assert read(t2, X) == 10
    assert read(any_tm.begin(), X) == 11


def test_g1c_circular_information_flow(any_tm: TransactionManager) -> None:
    setup(any_tm, x=10, y=20)
    t1, t2 = any_tm.begin(), any_tm.begin()
    t1.put(T, X, V, b"11")
    t2.put(T, Y, V, b"22")
    assert read(t1, Y) == 20
    assert read(t2, X) == 10
    t1.commit()
    t2.commit()


def test_otv_observed_transaction_vanishes(any_tm: TransactionManager) -> None:
    setup(any_tm, x=10, y=20)
    t1, t2 = any_tm.begin(), any_tm.begin()
    t1.put(T, X, V, b"11")
    t1.put(T, Y, V, b"19")
    t2.put(T, X, V, b"12")
    t2.put(T, Y, V, b"18")
    t1.commit()
    t3 = any_tm.begin()
    assert read(t3, X) == 11
    with pytest.raises(TransactionConflictError):
        t2.commit()
    assert read(t3, Y) == 19


def test_pmp_predicate_many_preceders(any_tm: TransactionManager) -> None:
    setup(any_tm, x=10, y=20)
    t1 = any_tm.begin()
    assert [r for r, _, _ in t1.scan(T)] == [X, Y]
    t2 = any_tm.begin()
    t2.put(T, Z, V, b"30")
    t2.commit()
    assert [r for r, _, _ in t1.scan(T)] == [X, Y]


def test_lost_update_p4(any_tm: TransactionManager) -> None:
    setup(any_tm, x=10)
    t1, t2 = any_tm.begin(), any_tm.begin()
    a, b = read(t1, X), read(t2, X)
    assert a is not None and b is not None
    t1.put(T, X, V, str(a + 1).encode())
    t2.put(T, X, V, str(b + 1).encode())
    t1.commit()
    with pytest.raises(TransactionConflictError):
        t2.commit()
    assert read(any_tm.begin(), X) == 11


def test_g_single_read_skew(any_tm: TransactionManager) -> None:
    setup(any_tm, x=50, y=50)
    t1 = any_tm.begin()
    assert read(t1, X) == 50
    t2 = any_tm.begin()
    t2.put(T, X, V, b"25")
    t2.put(T, Y, V, b"75")
    t2.commit()
    assert read(t1, Y) == 50  # not 75: x + y stays 100 in t1's snapshot


def test_g_single_read_skew_through_scan(any_tm: TransactionManager) -> None:
    setup(any_tm, x=50, y=50)
    t1 = any_tm.begin()
    rows = t1.scan(T)
    first = next(rows)
    t2 = any_tm.begin()
    t2.put(T, X, V, b"25")
    t2.put(T, Y, V, b"75")
    t2.commit()
    assert [first, *rows] == [(X, V, b"50"), (Y, V, b"50")]


def _write_skew(tm: TransactionManager, isolation: Isolation) -> TransactionConflictError | None:
    setup(tm, x=1, y=1)
    t1, t2 = tm.begin(isolation), tm.begin(isolation)
    assert (read(t1, X), read(t1, Y)) == (1, 1)
    assert (read(t2, X), read(t2, Y)) == (1, 1)
    t1.put(T, X, V, b"0")
    t2.put(T, Y, V, b"0")
    t1.commit()
    try:
        t2.commit()
    except TransactionConflictError as exc:
        return exc
    return None


def test_g2_item_write_skew_allowed_under_snapshot(any_tm: TransactionManager) -> None:
    assert _write_skew(any_tm, Isolation.SNAPSHOT) is None
    check = any_tm.begin()
    assert (read(check, X), read(check, Y)) == (0, 0)


def test_g2_item_write_skew_refused_under_serializable(any_tm: TransactionManager) -> None:
    assert _write_skew(any_tm, Isolation.SERIALIZABLE) is not None
    check = any_tm.begin()
    assert (read(check, X), read(check, Y)) == (0, 1)


def test_phantom_refused_under_serializable(any_tm: TransactionManager) -> None:
    setup(any_tm, x=1)
    t1 = any_tm.begin(Isolation.SERIALIZABLE)
    total = sum(int(v) for _, _, v in t1.scan(T, b"a", b"zz"))
    t2 = any_tm.begin(Isolation.SERIALIZABLE)
    t2.put(T, Y, V, b"5")
    t2.commit()
    t1.put("totals", b"sum", V, str(total).encode())
    with pytest.raises(TransactionConflictError, match="phantom"):
        t1.commit()


def test_serializable_scan_validates_only_what_was_iterated(any_tm: TransactionManager) -> None:
    setup(any_tm, x=1, y=2)
    t1 = any_tm.begin(Isolation.SERIALIZABLE)
    assert next(t1.scan(T)) == (X, V, b"1")  # stops after x
    t2 = any_tm.begin()
    t2.put(T, Z, V, b"9")  # beyond what t1 iterated
    t2.commit()
    t1.put("other", b"r", V, b"done")
    t1.commit()


def test_serializable_insert_into_a_read_but_absent_cell_aborts(any_tm: TransactionManager) -> None:
    t1 = any_tm.begin(Isolation.SERIALIZABLE)
    assert read(t1, X) is None
    t2 = any_tm.begin()
    t2.put(T, X, V, b"1")
    t2.commit()
    t1.put(T, Y, V, b"1")
    with pytest.raises(TransactionConflictError):
        t1.commit()


def test_read_only_transactions_never_abort(any_tm: TransactionManager) -> None:
    for isolation in Isolation:
        setup(any_tm, x=1, y=1)
        reader = any_tm.begin(isolation)
        assert read(reader, X) == 1
        list(reader.scan(T))
        with any_tm.begin() as writer:
            writer.put(T, X, V, b"2")
            writer.put(T, Y, V, b"2")
        assert read(reader, Y) == 1
        assert reader.commit() == reader.start_ts


def test_reads_see_own_writes_in_get_and_scan(any_tm: TransactionManager) -> None:
    setup(any_tm, x=1, y=2)
    tx = any_tm.begin()
    tx.put(T, b"w", V, b"0")
    tx.put(T, X, V, b"10")
    tx.delete(T, Y, V)
    assert read(tx, X) == 10 and read(tx, Y) is None
    assert tx.get_many(T, [(X, V), (Y, V), (b"w", V), (Z, V)]) == {(X, V): b"10", (b"w", V): b"0"}
    assert list(tx.scan(T)) == [(b"w", V, b"0"), (X, V, b"10")]
    assert list(tx.scan(T, b"x")) == [(X, V, b"10")]
    tx.commit()
    assert list(any_tm.begin().scan(T)) == [(b"w", V, b"0"), (X, V, b"10")]


def test_delete_then_reinsert(any_tm: TransactionManager) -> None:
    setup(any_tm, x=1)
    with any_tm.begin() as tx:
        tx.delete(T, X, V)
    assert read(any_tm.begin(), X) is None
    assert list(any_tm.begin().scan(T)) == []
    setup(any_tm, x=3)
    assert read(any_tm.begin(), X) == 3


def test_many_cells_and_tables_commit_atomically(any_tm: TransactionManager) -> None:
    with any_tm.begin() as tx:
        for i in range(300):
            tx.put(f"t{i % 3}", f"row{i:04d}".encode(), b"c", str(i).encode())
    reader = any_tm.begin()
    counts = [len(list(reader.scan(f"t{k}"))) for k in range(3)]
    assert counts == [100, 100, 100]
