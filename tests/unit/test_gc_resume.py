"""Resumable garbage-collection passes (issue 17): a pass that dies leaves a cursor in
the ``_gc`` row ``cursor``, and the next pass, in this process or another, resumes it
at the cursor's safe point, sweeping only the cells after it (rules S8, S9; see
"Resumable passes" in docs/design/gc.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from storage_adapters import Cell, KVStore, StoreError
from txn import GarbageCollector, TransactionConfig, TransactionManager
from txn._gc import CURSOR_KEY, GcCursor
from txn.errors import TransactionAbortedError
from txn.tables import GC_TABLE, STATE_KEY, TXN_TABLE, GcState, decode_outcome, read_state, txn_key

pytestmark = pytest.mark.unit

CONFIG = TransactionConfig(resolve_wait_ms=0, lock_wait_ms=0, gc_publish_interval_ms=10**9)


class Dies(StoreError):
    """The collector's process dies here (injected)."""


class Interrupting:
    """The store as one collector sees it: its ``fail_at``-th call of ``method`` raises
    before doing anything, as if the process died there; every call before it ran whole.
    ``each`` runs before every call of ``method`` (to interleave another collector)."""

    def __init__(
        self,
        store: KVStore,
        method: str,
        fail_at: int | None,
        each: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._method = method
        self._fail_at = fail_at
        self._each = each
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name != self._method:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self._each is not None:
                self._each(self.calls)
            if self.calls == self._fail_at:
                raise Dies(f"injected: the collector dies at {name} call {self.calls}")
            return attr(*args, **kwargs)

        return call


@pytest.fixture(params=["memory", "sqlite"])
def tm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionManager]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/gc.db"
    manager = _manager(url)
    yield manager
    manager.close()


def _manager(url: str) -> TransactionManager:
    manager = TransactionManager.embedded(url, config=CONFIG)
    # A grace of 0 before any reader leases the state row: passes need not wait.
    manager.store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=0).encode())
    return manager


def _collector(
    tm: TransactionManager,
    store: object | None = None,
    *,
    oracle: bool = True,
    **kw: Any,
) -> GarbageCollector:
    """A collector as another process would run it: its own object, nothing shared with
    an earlier one but the store. Without ``oracle`` its safe point is the newest
    timestamp the managers published (deterministic between collectors)."""
    args: dict[str, Any] = {"retention_s": 0, "grace_ms": 0, "cursor_every_s": 0, **kw}
    return GarbageCollector(
        cast(KVStore, store if store is not None else tm.store),
        timestamps=tm._rt.timestamps if oracle else None,
        locks=tm.locks,
        config=CONFIG,
        **args,
    )


def _commit(
    tm: TransactionManager, writes: Mapping[tuple[str, Cell], bytes | None]
) -> tuple[int, int]:
    tx = tm.begin()
    for (table, cell), value in writes.items():
        if value is None:
            tx.delete(table, cell.row, cell.column)
        else:
            tx.put(table, cell.row, cell.column, value)
    tx.commit()
    assert tx.commit_ts is not None
    return tx.start_ts, tx.commit_ts


def _cursor(store: KVStore) -> GcCursor | None:
    raw = store.get_system(GC_TABLE, [CURSOR_KEY]).get(CURSOR_KEY)
    return None if raw is None else GcCursor.decode(raw)


def _entries(store: KVStore, start_tss: list[int]) -> dict[int, int]:
    rows = store.get_system(TXN_TABLE, [txn_key(ts) for ts in start_tss])
    return {ts: decode_outcome(rows[txn_key(ts)]) for ts in start_tss if txn_key(ts) in rows}


def _cells(n: int) -> list[Cell]:
    return [Cell(b"r%02d" % i, b"c") for i in range(n)]


def _unsafe_versions(
    store: KVStore, tables: dict[str, list[Cell]], committed: set[int] | None = None
) -> list[str]:
    """Rule S9 on the store as it is: every version of a committed writer (of every
    writer if ``committed`` is None) carries its commit stamp or its writer's entry is
    there (a version with neither reads as aborted)."""
    found = []
    for table, cells in tables.items():
        for cell, versions in store.get_versions(table, cells).items():
            unstamped = [v.ts for v in versions if v.commit_ts is None]
            if committed is not None:
                unstamped = [ts for ts in unstamped if ts in committed]
            entries = _entries(store, unstamped)
            found += [f"{table} {cell} {ts}" for ts in unstamped if ts not in entries]
    return found


def _read_all(
    tm: TransactionManager, tables: dict[str, list[Cell]]
) -> dict[tuple[str, Cell], bytes]:
    """What a fresh transaction reads, with outcomes from the store only (as a reader in
    another process: this manager's cache of outcomes is dropped)."""
    tm._rt.resolver.clear_cache()
    tx = tm.begin()
    got = {
        (table, cell): value
        for table, cells in tables.items()
        for cell in cells
        if (value := tx.get(table, cell.row, cell.column)) is not None
    }
    tx.commit()
    return got


# Ten cells in each of two tables, each written twice (the first value is hidden by the
# second); pages of 4 cells: t (4, 4, 2), u (4, 4, 2).
T, U = _cells(10), _cells(10)
TABLES = {"t": T, "u": U}


def _two_writers_per_cell(tm: TransactionManager) -> dict[tuple[str, Cell], tuple[int, int]]:
    """Returns, per cell, the start_ts of the hidden writer and of the kept one."""
    writers = {}
    for table, cells in TABLES.items():
        for cell in cells:
            first, _ = _commit(tm, {(table, cell): b"old"})
            second, _ = _commit(tm, {(table, cell): b"new " + table.encode() + cell.row})
            writers[(table, cell)] = (first, second)
    return writers


def test_an_interrupted_pass_is_resumed_from_its_cursor_by_a_new_collector(
    tm: TransactionManager,
) -> None:
    writers = _two_writers_per_cell(tm)
    expected = _read_all(tm, TABLES)
    # Dies at its fifth page: t swept whole (3 pages), u's first page (4 cells) too.
    dying = Interrupting(tm.store, "get_versions", fail_at=5)
    with pytest.raises(Dies):
        _collector(tm, dying, page_cells=4).run_once()
    cursor = _cursor(tm.store)
    assert cursor is not None and cursor.position == ("u", U[3].row, U[3].column)
    safe_point = cursor.safe_point
    assert read_state(tm.store)[0].collected_below == 0
    assert _unsafe_versions(tm.store, TABLES) == []

    resumed = _collector(tm, page_cells=4).run_once()  # a new collector: a restart

    assert resumed.safe_point == safe_point  # the cursor's, not a newer one
    assert "'u'" in resumed.resumed_from and "r03" in resumed.resumed_from
    assert "resumed after table 'u'" in resumed.summary()
    assert (resumed.tables, resumed.cells) == (1, 6)  # u's cells after the cursor only
    assert resumed.versions_deleted == 6 and resumed.versions_stamped == 6
    # It collected the entries of the writers it met (u[4:]'s two writers each) ...
    assert resumed.entries_deleted == 12
    after_cursor = [
        ts for (table, cell), pair in writers.items() for ts in pair if table == "u" and cell > U[3]
    ]
    assert _entries(tm.store, after_cursor) == {}
    # ... and not collected_below: it never met the writers before the cursor.
    state = read_state(tm.store)[0]
    assert state.collected_below == 0 and state.last_pass["resumed_from"] == resumed.resumed_from
    assert _cursor(tm.store) is None
    # Every version below the safe point was swept: one stamped version per cell.
    for table, cells in TABLES.items():
        versions = tm.store.get_versions(table, cells)
        assert {
            c: [(v.value, v.commit_ts is not None) for v in vs] for c, vs in versions.items()
        } == {c: [(b"new " + table.encode() + c.row, True)] for c in cells}
    assert _unsafe_versions(tm.store, TABLES) == []
    assert _read_all(tm, TABLES) == expected

    # The next pass starts from the beginning and meets the stamps of the writers kept
    # before the cursor: their entries go, and collected_below rises.
    full = _collector(tm, page_cells=4).run_once()
    assert full.resumed_from == "" and full.cells == 20
    kept_before = [
        pair[1] for (table, cell), pair in writers.items() if table == "t" or cell <= U[3]
    ]
    hidden_before = [
        pair[0] for (table, cell), pair in writers.items() if table == "t" or cell <= U[3]
    ]
    assert full.entries_deleted == len(kept_before) == 14
    assert read_state(tm.store)[0].collected_below == full.safe_point
    # Left, as after any pass that died: the entries of the writers whose every version
    # the interrupted attempt deleted (hidden below the safe point) and whose entries it
    # never reached. No pass meets them again (docs/design/limits.md, Known limits).
    left = _entries(tm.store, [ts for pair in writers.values() for ts in pair])
    assert sorted(left) == sorted(hidden_before)
    assert _read_all(tm, TABLES) == expected


def test_a_pass_that_dies_inside_a_page_sweeps_that_page_again(tm: TransactionManager) -> None:
    _two_writers_per_cell(tm)
    expected = _read_all(tm, TABLES)
    # Stamps of t's first two pages written, the third page's stamps fail: its deletes
    # never happen, and the cursor stays at the end of the second page.
    dying = Interrupting(tm.store, "stamp_versions", fail_at=3)
    with pytest.raises(Dies):
        _collector(tm, dying, page_cells=4).run_once()
    cursor = _cursor(tm.store)
    assert cursor is not None and cursor.position == ("t", T[7].row, T[7].column)
    assert _unsafe_versions(tm.store, TABLES) == []
    resumed = _collector(tm, page_cells=4).run_once()
    assert (resumed.tables, resumed.cells) == (2, 2 + 10)
    assert _unsafe_versions(tm.store, TABLES) == []
    assert _read_all(tm, TABLES) == expected


def test_a_writer_on_both_sides_of_the_cursor_stays_committed(tm: TransactionManager) -> None:
    """W wrote a cell before the cursor and one after it: the interrupted attempt stamped
    the first, the resumed pass stamps the second and deletes W's entry."""
    _two_writers_per_cell(tm)
    both = {("t", T[1]): b"w-t1", ("u", U[8]): b"w-u8", ("t", T[9]): None}
    w_start, w_commit = _commit(tm, both)
    expected = _read_all(tm, TABLES)
    with pytest.raises(Dies):
        _collector(tm, Interrupting(tm.store, "get_versions", fail_at=2), page_cells=4).run_once()
    assert _cursor(tm.store) is not None  # after T[3]: T[1] before it, U[8] and T[9] after
    _collector(tm, page_cells=4).run_once()
    assert _entries(tm.store, [w_start]) == {}  # collected by the resumed pass
    t1 = tm.store.get_versions("t", [T[1]])[T[1]]
    assert [(v.ts, v.commit_ts) for v in t1] == [(w_start, w_commit)]  # stamped before
    assert tm.store.get_versions("t", [T[9]]) == {}  # its delete went, last
    assert _unsafe_versions(tm.store, TABLES) == []
    assert _read_all(tm, TABLES) == expected
    assert expected[("t", T[1])] == b"w-t1" and ("t", T[9]) not in expected


def test_resuming_below_a_newer_safe_point_would_lose_a_commit() -> None:
    """Why a resumed pass sweeps below its cursor's safe point: a writer that committed
    between the two safe points, with a version before the cursor, was never stamped
    there; a resume below the newer safe point meets it after the cursor and deletes its
    entry, and a reader then takes it for aborted (S9 broken). The checks above see it."""
    tm = _manager("memory://")
    try:
        _two_writers_per_cell(tm)
        with pytest.raises(Dies):
            _collector(
                tm, Interrupting(tm.store, "get_versions", fail_at=2), page_cells=4
            ).run_once()
        cursor = _cursor(tm.store)
        assert cursor is not None
        late = {("t", T[0]): b"late-t0", ("u", U[5]): b"late-u5"}
        late_start, _ = _commit(tm, late)
        expected = _read_all(tm, TABLES)
        # The broken resume: the cursor moved to a safe point above the late writer.
        newer = tm._rt.timestamps.next_timestamp()
        state, raw = read_state(tm.store)
        bumped = GcState(newer, 0, state.collected_below, state.samples, state.last_pass)
        assert tm.store.compare_and_set(GC_TABLE, STATE_KEY, raw, bumped.encode()).applied
        broken = GcCursor(newer, cursor.table, cursor.row, cursor.column)
        tm.store.compare_and_set(
            GC_TABLE,
            CURSOR_KEY,
            tm.store.get_system(GC_TABLE, [CURSOR_KEY])[CURSOR_KEY],
            broken.encode(),
        )
        _collector(tm, page_cells=4).run_once()
        assert _entries(tm.store, [late_start]) == {}
        assert _unsafe_versions(tm.store, TABLES) == [f"t {T[0]} {late_start}"]
        assert _read_all(tm, TABLES) != expected
    finally:
        tm.close()


def test_another_collector_resumes_what_one_left(tm: TransactionManager) -> None:
    """Two gateways: the first dies mid-pass; the second, with other page sizes, resumes."""
    _two_writers_per_cell(tm)
    expected = _read_all(tm, TABLES)
    with pytest.raises(Dies):
        _collector(tm, Interrupting(tm.store, "get_versions", fail_at=4), page_cells=3).run_once()
    cursor = _cursor(tm.store)
    assert cursor is not None and cursor.position == ("t", T[8].row, T[8].column)
    other = _collector(tm, page_cells=7, cursor_every_s=3600)
    report = other.run_once()
    assert report.safe_point == cursor.safe_point and (report.tables, report.cells) == (2, 11)
    assert _cursor(tm.store) is None
    # Its next pass is a fresh one, above: raises the safe point and collected_below.
    again = other.run_once()
    assert again.resumed_from == "" and again.safe_point > cursor.safe_point
    assert read_state(tm.store)[0].collected_below == again.safe_point
    assert _unsafe_versions(tm.store, TABLES) == []
    assert _read_all(tm, TABLES) == expected


def test_concurrent_passes_at_one_safe_point_never_move_the_cursor_back(
    tm: TransactionManager,
) -> None:
    """Collector B runs a whole pass; before its first page, collector A (same safe
    point) sweeps further and dies. B's saves behind A's cursor do not overwrite it."""
    _two_writers_per_cell(tm)
    expected = _read_all(tm, TABLES)
    oldest, latest = tm._rt.active.oldest()
    tm._rt.registration.publish(oldest, latest)  # the one timestamp sample: one safe point
    seen: list[GcCursor | None] = []

    def interleave(call: int) -> None:
        if call == 1:
            dying = Interrupting(tm.store, "get_versions", fail_at=4)
            with pytest.raises(Dies):
                _collector(tm, dying, oracle=False, page_cells=2).run_once()
        seen.append(_cursor(tm.store))

    b = _collector(
        tm, Interrupting(tm.store, "get_versions", None, interleave), oracle=False, page_cells=2
    )
    report = b.run_once()
    a_cursor = seen[0]  # A swept three pages from the start, at B's safe point
    assert a_cursor is not None and a_cursor.position == ("t", T[5].row, T[5].column)
    positions = [(c.safe_point, c.position) for c in seen if c is not None]
    assert positions == sorted(positions) and len(positions) == len(seen) == 10
    assert positions[1] == positions[0]  # B's pages 1-3 are behind A's cursor: not saved
    assert {sp for sp, _ in positions} == {report.safe_point}
    # B finished from the start: it clears the cursor and raises collected_below.
    assert report.resumed_from == "" and report.cells == 20
    assert _cursor(tm.store) is None
    assert read_state(tm.store)[0].collected_below == report.safe_point
    assert _unsafe_versions(tm.store, TABLES) == []
    assert _read_all(tm, TABLES) == expected


def test_a_pass_below_a_newer_cursor_leaves_it_for_a_resume(tm: TransactionManager) -> None:
    """B sweeps below sp1; meanwhile A raises the safe point to sp2 and dies. B neither
    overwrites nor clears A's cursor; the next pass resumes A's at sp2."""
    _two_writers_per_cell(tm)
    expected = _read_all(tm, TABLES)

    def interleave(call: int) -> None:
        if call == 1:
            with pytest.raises(Dies):
                _collector(
                    tm, Interrupting(tm.store, "get_versions", fail_at=3), page_cells=4
                ).run_once()

    b = _collector(tm, Interrupting(tm.store, "get_versions", None, interleave), page_cells=4)
    low = b.run_once()
    cursor = _cursor(tm.store)
    assert cursor is not None and cursor.safe_point > low.safe_point
    assert cursor.position == ("t", T[7].row, T[7].column)
    assert read_state(tm.store)[0].collected_below == low.safe_point
    resumed = _collector(tm, page_cells=4).run_once()
    assert resumed.safe_point == cursor.safe_point and resumed.resumed_from
    # B's finished pass left every cell settled (one stamped value below the
    # collected_below it raised) and nothing was written since: the cells after the
    # cursor (2 of t, 10 of u) hold no work, and the store yields none of them.
    assert resumed.cells == 0
    assert _unsafe_versions(tm.store, TABLES) == []
    assert _read_all(tm, TABLES) == expected


def test_obsolete_or_corrupt_cursors_are_dropped(tm: TransactionManager) -> None:
    _two_writers_per_cell(tm)
    full = _collector(tm).run_once()
    # A cursor at or below collected_below: a pass at that safe point finished.
    stale = GcCursor(full.safe_point, "t", T[3].row, T[3].column)
    assert tm.store.put_unless_exists(GC_TABLE, CURSOR_KEY, stale.encode()).applied
    report = _collector(tm).run_once()
    assert report.resumed_from == "" and report.safe_point > full.safe_point
    assert _cursor(tm.store) is None
    # A cursor above the state row's safe point is not backed by it: readers were never
    # told of it, so no pass may sweep below it.
    ahead = GcCursor(1 << 62, "t", T[3].row, T[3].column)
    assert tm.store.put_unless_exists(GC_TABLE, CURSOR_KEY, ahead.encode()).applied
    assert _collector(tm).run_once().resumed_from == ""
    assert _cursor(tm.store) is None
    assert tm.store.put_unless_exists(GC_TABLE, CURSOR_KEY, b"{not json").applied
    assert _collector(tm).run_once().resumed_from == ""
    assert _cursor(tm.store) is None
    with pytest.raises(StoreError, match="corrupt garbage-collection cursor"):
        GcCursor.decode(b'{"safe_point": 1}')
    with pytest.raises(ValueError, match="cursor_every_s must be >= 0"):
        _collector(tm, cursor_every_s=-1)


def test_a_long_pass_saves_its_cursor_every_few_seconds_not_every_page(
    tm: TransactionManager,
) -> None:
    _two_writers_per_cell(tm)
    now = [0.0]

    def monotonic() -> float:
        now[0] += 1.0  # a second per reading
        return now[0]

    counting = Interrupting(tm.store, "compare_and_set", None)
    report = _collector(
        tm, counting, page_cells=1, cursor_every_s=10, monotonic=monotonic
    ).run_once()
    assert report.cells == 20
    # Raising the safe point and recording the pass are two; 20 pages of a second each
    # saved every 10 seconds are 1 to 3 more, not 20.
    assert 2 + 1 <= counting.calls <= 2 + 3
    _two_writers_per_cell(tm)
    every_page = Interrupting(tm.store, "compare_and_set", None)
    assert _collector(tm, every_page, page_cells=1).run_once().cells == 20
    assert every_page.calls == 2 + 20


# --- the property: any writers, any interruption -------------------------------------

KEYS = [("t", Cell(b"r%d" % r, b"c%d" % c)) for r in range(3) for c in range(2)]
KEYS += [("u", Cell(b"r%d" % r, b"c0")) for r in range(3)]
PROPERTY_TABLES = {
    table: [cell for t, cell in KEYS if t == table] for table in sorted({t for t, _ in KEYS})
}

writer_strategy = st.tuples(
    st.just("write"),
    st.dictionaries(
        st.sampled_from(KEYS),
        st.one_of(st.none(), st.binary(min_size=1, max_size=3)),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["commit", "commit", "commit", "abandon"]),
)
#: A pass whose ``fail_at``-th call of the method dies (a pass with fewer calls finishes).
death_strategy = st.tuples(
    st.sampled_from(["get_versions", "stamp_versions", "delete_versions"]), st.integers(2, 5)
)
#: A round: a pass that may die, writers after it, and whether another collector then
#: raises the safe point (it read no cursor: it began before one was saved) and dies
#: before it sweeps anything.
round_strategy = st.tuples(death_strategy, st.lists(writer_strategy, max_size=3), st.booleans())


def _write(
    tm: TransactionManager, writes: dict[tuple[str, Cell], bytes | None], how: str
) -> tuple[int, int] | None:
    """A writer: committed (returns its start and commit), or abandoned after writing
    its versions (a crashed committer), or refused by an abandoned writer's locks."""
    tx = tm.begin()
    for (table, cell), value in writes.items():
        if value is None:
            tx.delete(table, cell.row, cell.column)
        else:
            tx.put(table, cell.row, cell.column, value)
    try:
        if how == "abandon":
            committer = tx.committer()
            committer.step()  # lock
            committer.step()  # write: versions of a writer that never commits
            return None
        tx.commit()
    except TransactionAbortedError:
        return None  # an abandoned writer holds a lock it needs
    assert tx.commit_ts is not None
    return tx.start_ts, tx.commit_ts


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writers=st.lists(writer_strategy, min_size=1, max_size=8),
    rounds=st.lists(round_strategy, min_size=1, max_size=3),
    page_cells=st.integers(1, 3),
)
def test_any_interruptions_then_a_resume_keep_s8_and_s9(
    writers: list[tuple[Any, ...]],
    rounds: list[tuple[tuple[str, int], list[tuple[Any, ...]], bool]],
    page_cells: int,
) -> None:
    """Random writers (some abandon their commit after writing), then rounds of a pass
    that dies at a random call (the next one resumes it), more writers, and perhaps a
    safe point raised meanwhile by another collector; then a pass that finishes. After
    every pass, S9: every version of a committed writer is stamped or has its entry. At
    the end, S8: a snapshot above the safe point reads what the writers committed; and
    the passes together swept every cell: below the safe point each cell keeps at most
    one version, committed and stamped with its writer's commit timestamp."""
    steps: list[tuple[Any, ...]] = list(writers)
    for (method, fail_at), more, raised in rounds:
        steps += [("pass", method, fail_at), *more] + ([("raise",)] if raised else [])
    tm = _manager("memory://")
    try:
        commits: dict[int, int] = {}
        model: dict[tuple[str, Cell], tuple[int, bytes | None]] = {}
        resumes = 0
        for step in [*steps, ("pass", "get_versions", None)]:
            if step[0] == "write":
                _, writes, how = step
                done = _write(tm, writes, how)
                if done is not None:
                    commits[done[0]] = done[1]
                    model.update({key: (done[1], value) for key, value in writes.items()})
                continue
            if step[0] == "raise":
                _collector(tm)._raise_safe_point()
                continue
            _, method, fail_at = step
            try:
                report = _collector(
                    tm, Interrupting(tm.store, method, fail_at), page_cells=page_cells
                ).run_once()
                resumes += report.resumed_from != ""
            except Dies:
                pass
            assert _unsafe_versions(tm.store, PROPERTY_TABLES, set(commits)) == []
        event(f"passes resumed: {min(resumes, 2)}")
        safe_point = report.safe_point
        expected = {key: value for key, (_, value) in model.items() if value is not None}
        assert _read_all(tm, PROPERTY_TABLES) == expected
        for table, cells in PROPERTY_TABLES.items():
            for cell, versions in tm.store.get_versions(table, cells).items():
                for v in versions:  # a stamp carries its writer's one commit timestamp
                    assert v.commit_ts is None or v.commit_ts == commits[v.ts]
                below = [v for v in versions if v.ts < safe_point]
                committed_below = [v for v in below if commits.get(v.ts, safe_point) < safe_point]
                assert len(committed_below) <= 1, (table, cell, versions)
                assert all(v.commit_ts is not None and v.value is not None for v in committed_below)
                assert [v for v in below if v.ts not in commits] == [], (table, cell, versions)
    finally:
        tm.close()
