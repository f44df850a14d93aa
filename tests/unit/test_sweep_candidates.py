"""``KVStore.sweep_candidates`` on the backends that filter where the data is (memory,
SQLite): exactly the cells a sweep has work on, for any history of versions, stamps
and deletes, any safe point, any page size and any cursor. (The contract suite checks
fixed cases on every backend, Cassandra included.)"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage_adapters import Cell, KVStore, Version, VersionStamp, VersionWrite
from storage_adapters.memory import MemoryStore
from storage_adapters.sqlite import SQLiteStore

pytestmark = pytest.mark.unit

ROWS = [b"a", b"b", b"c"]
COLUMNS = [b"x", b"y"]

versions_st = st.lists(
    st.tuples(
        st.sampled_from(ROWS),
        st.sampled_from(COLUMNS),
        st.integers(1, 40),  # ts
        st.one_of(st.none(), st.just(b"v")),  # a delete or a value
        st.one_of(st.none(), st.integers(1, 60)),  # its stamp: commit_ts - ts
    ),
    max_size=25,
    unique_by=lambda v: (v[0], v[1], v[2]),
)


def needs_work(versions: list[Version], stamped_below: int) -> bool:
    if len(versions) != 1:
        return bool(versions)
    (only,) = versions
    return only.commit_ts is None or only.commit_ts >= stamped_below or only.value is None


def check(
    store: KVStore,
    history: list[tuple[bytes, bytes, int, bytes | None, int | None]],
    deleted: list[int],
    below_ts: int,
    stamped_below: int,
    page_size: int,
    start: tuple[bytes, bytes],
) -> None:
    store.put_versions("t", [VersionWrite(r, c, ts, v) for r, c, ts, v, _ in history])
    stamps = [VersionStamp(r, c, ts, ts + d) for r, c, ts, _, d in history if d is not None]
    if stamps:
        store.stamp_versions("t", stamps)
    gone = [(r, c, ts) for i, (r, c, ts, _, _) in enumerate(history) if i in set(deleted)]
    if gone:
        store.delete_versions("t", gone)
    cells = [Cell(r, c) for r in ROWS for c in COLUMNS]
    found = store.get_versions("t", cells, below_ts=below_ts)
    expected = [
        cell
        for cell in cells
        if cell in found and needs_work(found[cell], stamped_below) and cell >= Cell(*start)
    ]
    got = list(
        store.sweep_candidates(
            "t",
            below_ts,
            stamped_below,
            start_row=start[0],
            start_column=start[1],
            page_size=page_size,
        )
    )
    assert got == expected


arguments = {
    "history": versions_st,
    "deleted": st.lists(st.integers(0, 24), max_size=5),
    "below_ts": st.integers(1, 45),
    "stamped_below": st.integers(0, 100),
    "page_size": st.integers(1, 4),
    "start": st.tuples(st.sampled_from([b"", *ROWS]), st.sampled_from([b"", *COLUMNS])),
}


@contextlib.contextmanager
def opened(backend: str) -> Iterator[KVStore]:
    if backend == "memory":
        yield MemoryStore()
        return
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteStore(f"sqlite:///{Path(folder) / 's.db'}")
        try:
            yield store
        finally:
            store.close()


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@settings(max_examples=120, deadline=None)
@given(**arguments)
def test_the_store_yields_exactly_the_cells_with_work(
    backend: str,
    history: list[tuple[bytes, bytes, int, bytes | None, int | None]],
    deleted: list[int],
    below_ts: int,
    stamped_below: int,
    page_size: int,
    start: tuple[bytes, bytes],
) -> None:
    with opened(backend) as store:
        check(store, history, deleted, below_ts, stamped_below, page_size, start)
