"""The store calls over several tables at once (issue 27): ``put_versions_of_tables`` and
``get_version_timestamps_of_tables`` answer on every backend exactly as one call per
table would, which the generic versions of the base class make by construction and the
Cassandra store (one set of requests for every table) must match.
"""

from __future__ import annotations

import pytest

from storage_adapters import MAX_TIMESTAMP, Cell, KVStore, VersionWrite

pytestmark = pytest.mark.contract


def test_writes_of_several_tables_land_as_one_call_per_table_would(store: KVStore) -> None:
    # Shard-heavy and light tables together: 12 rows of one table share rows' shards,
    # the others have one or two cells.
    many = [VersionWrite(b"r%02d" % i, b"c", 10, b"v%d" % i) for i in range(12)]
    store.put_versions_of_tables(
        [
            ("a", many),
            ("b", [VersionWrite(b"r00", b"c", 10, b"b"), VersionWrite(b"r00", b"c", 11, None)]),
            ("c", [VersionWrite(b"x", b"y", 5, b"c1"), VersionWrite(b"x", b"y", 5, b"c2")]),
            ("d", []),
        ]
    )
    assert [e.row for e in store.scan("a", b"", None, MAX_TIMESTAMP)] == [w.row for w in many]
    latest_b = store.get_latest("b", [(b"r00", b"c")], MAX_TIMESTAMP)
    assert latest_b[Cell(b"r00", b"c")].ts == 11 and latest_b[Cell(b"r00", b"c")].value is None
    # A version listed twice keeps its last value, as in put_versions.
    assert store.get_latest("c", [(b"x", b"y")], 6)[Cell(b"x", b"y")].value == b"c2"
    assert list(store.scan("d", b"", None, MAX_TIMESTAMP)) == []
    # The tables stay apart: the same cell in "a" kept its own value.
    assert store.get_latest("a", [(b"r00", b"c")], MAX_TIMESTAMP)[Cell(b"r00", b"c")].value == b"v0"


def test_timestamps_of_several_tables_match_one_call_per_table(store: KVStore) -> None:
    store.put_versions("a", [VersionWrite(b"k", b"c", ts, b"v") for ts in (3, 5, 7, 9)])
    store.put_versions("b", [VersionWrite(b"k", b"c", 4, b"v"), VersionWrite(b"m", b"c", 6, b"v")])
    store.put_versions("c", [VersionWrite(b"k", b"c", MAX_TIMESTAMP, b"top")])
    reads = [
        ("a", [(b"k", b"c"), (b"absent", b"c")]),
        ("b", [(b"k", b"c"), (b"m", b"c")]),
        ("c", [(b"k", b"c")]),
        ("a", [(b"k", b"c")]),
    ]
    for limit in (None, 2):
        got = store.get_version_timestamps_of_tables(reads, limit=limit)
        expected = [store.get_version_timestamps(t, cells, limit=limit) for t, cells in reads]
        assert got == expected
    assert store.get_version_timestamps_of_tables(reads, limit=2)[0] == {Cell(b"k", b"c"): [9, 7]}
    assert store.get_version_timestamps_of_tables([]) == []


def test_a_bad_table_name_among_several_is_refused(store: KVStore) -> None:
    with pytest.raises(ValueError):
        store.put_versions_of_tables(
            [("good", [VersionWrite(b"r", b"c", 1, b"v")]), ("bad name", [])]
        )
    with pytest.raises(ValueError):
        store.get_version_timestamps_of_tables([("good", [(b"r", b"c")]), ("bad name", [])])


def test_versions_read_back_match_a_write_then_a_read(store: KVStore) -> None:
    """``put_versions_read_back_of_tables`` (a commit's write step with the first read of
    its conflict check) writes as ``put_versions_of_tables`` and answers as
    ``get_version_timestamps_of_tables`` of the cells written, read afterwards: older
    versions and the call's own, of every table, a cell written twice at two
    timestamps, 12 cells of one table sharing shards."""
    store.put_versions("a", [VersionWrite(b"k", b"c", ts, b"old") for ts in (3, 5, 30)])
    many = [VersionWrite(b"r%02d" % i, b"c", 10, b"v%d" % i) for i in range(12)]
    writes = [
        ("a", [VersionWrite(b"k", b"c", 10, b"mine"), *many]),
        ("b", [VersionWrite(b"x", b"y", 10, None), VersionWrite(b"x", b"y", 11, b"z")]),
        ("c", []),
        ("a", [VersionWrite(b"k", b"c", 10, b"mine")]),
    ]
    for limit in (None, 2):
        got = store.put_versions_read_back_of_tables(writes, limit=limit)
        cells = [(t, sorted({(v.row, v.column) for v in vs})) for t, vs in writes]
        assert got == store.get_version_timestamps_of_tables(cells, limit=limit)
    assert got[0][Cell(b"k", b"c")] == [30, 10]
    assert got[1] == {Cell(b"x", b"y"): [11, 10]}
    assert got[2] == {}
    assert store.get_latest("a", [(b"k", b"c")], 11)[Cell(b"k", b"c")].value == b"mine"
    assert [e.row for e in store.scan("a", b"r", None, MAX_TIMESTAMP)] == [w.row for w in many]
    assert store.put_versions_read_back_of_tables([]) == []


def test_bad_input_to_a_read_back_writes_nothing(store: KVStore) -> None:
    good = ("good", [VersionWrite(b"r", b"c", 1, b"v")])
    with pytest.raises(ValueError, match="invalid table name"):
        store.put_versions_read_back_of_tables([good, ("bad name", [])])
    with pytest.raises(TypeError):
        store.put_versions_read_back_of_tables([good, ("other", [("r", b"c", 1, b"v")])])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="limit"):
        store.put_versions_read_back_of_tables([good], limit=0)
    assert store.get_version_timestamps("good", [(b"r", b"c")]) == {}
