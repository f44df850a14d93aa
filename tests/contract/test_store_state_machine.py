"""A hypothesis state machine that drives a backend and a plain dict model in lockstep."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from storage_adapters import KVStore, ScanEntry, Version, VersionWrite, open_store

pytestmark = [pytest.mark.contract, pytest.mark.property]

TABLES = st.sampled_from(["a", "b"])
ROWS = st.sampled_from([b"r0", b"r1", b"r2", b"r10", b"r\x00", b"s"])
COLS = st.sampled_from([b"c0", b"c1", b"d"])
TSS = st.integers(min_value=0, max_value=30)
VALUES = st.one_of(st.none(), st.binary(max_size=4))
KEYS = st.sampled_from([b"k0", b"k1", b"k2"])

Model = dict[tuple[str, bytes, bytes], dict[int, bytes | None]]


class StoreAgreesWithDict(RuleBasedStateMachine):
    """Every rule applies one operation to both; results must be equal."""

    store_url: Callable[[], str]

    def __init__(self) -> None:
        super().__init__()
        self.store: KVStore = open_store(type(self).store_url())
        self.model: Model = {}
        self.system: dict[tuple[str, bytes], bytes] = {}

    def teardown(self) -> None:
        self.store.close()

    @rule(
        table=TABLES,
        writes=st.lists(st.tuples(ROWS, COLS, TSS, VALUES), min_size=1, max_size=5),
    )
    def put_versions(
        self, table: str, writes: list[tuple[bytes, bytes, int, bytes | None]]
    ) -> None:
        self.store.put_versions(table, [VersionWrite(r, c, ts, v) for r, c, ts, v in writes])
        for r, c, ts, v in writes:
            self.model.setdefault((table, r, c), {})[ts] = v

    @rule(table=TABLES, cells=st.lists(st.tuples(ROWS, COLS), max_size=4), below=TSS)
    def get_latest(self, table: str, cells: list[tuple[bytes, bytes]], below: int) -> None:
        got = self.store.get_latest(table, cells, below)
        expected = {}
        for r, c in cells:
            versions = self.model.get((table, r, c), {})
            older = [ts for ts in versions if ts < below]
            if older:
                ts = max(older)
                expected[(r, c)] = Version(ts, versions[ts])
        assert {tuple(k): v for k, v in got.items()} == expected

    @rule(
        table=TABLES,
        start=st.sampled_from([b"", b"r1", b"r10", b"s"]),
        end=st.sampled_from([None, b"r1", b"r2", b"zz"]),
        below=TSS,
        page=st.integers(1, 4),
    )
    def scan(self, table: str, start: bytes, end: bytes | None, below: int, page: int) -> None:
        got = list(self.store.scan(table, start, end, below, page_size=page))
        expected = []
        for (t, r, c), versions in sorted(self.model.items()):
            if t != table or r < start or (end is not None and r >= end):
                continue
            older = [ts for ts in versions if ts < below]
            if older:
                ts = max(older)
                expected.append(ScanEntry(r, c, ts, versions[ts]))
        assert got == expected

    @rule(table=TABLES, row=ROWS, col=COLS, above=TSS, below=TSS)
    def version_timestamps(
        self, table: str, row: bytes, col: bytes, above: int, below: int
    ) -> None:
        got = self.store.get_version_timestamps(table, [(row, col)], above_ts=above, below_ts=below)
        tss = sorted(
            (ts for ts in self.model.get((table, row, col), {}) if above < ts < below),
            reverse=True,
        )
        assert got == ({(row, col): tss} if tss else {})

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete_version(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        versions = self.model[key]
        if not versions:
            return
        ts = data.draw(st.sampled_from(sorted(versions)))
        table, r, c = key
        self.store.delete_versions(table, [(r, c, ts)])
        del versions[ts]

    @rule(table=TABLES, key=KEYS, value=st.binary(min_size=0, max_size=3))
    def put_unless_exists(self, table: str, key: bytes, value: bytes) -> None:
        result = self.store.put_unless_exists(table, key, value)
        existing = self.system.get((table, key))
        if existing is None:
            assert result.applied and result.current == value
            self.system[(table, key)] = value
        else:
            assert not result.applied and result.current == existing

    @rule(
        table=TABLES,
        key=KEYS,
        expected=st.one_of(st.none(), st.binary(max_size=3)),
        value=st.binary(max_size=3),
    )
    def compare_and_set(self, table: str, key: bytes, expected: bytes | None, value: bytes) -> None:
        result = self.store.compare_and_set(table, key, expected, value)
        current = self.system.get((table, key))
        if current == expected:
            assert result.applied
            self.system[(table, key)] = value
        else:
            assert not result.applied and result.current == current

    @invariant()
    def system_rows_agree(self) -> None:
        for table in ("a", "b"):
            got = self.store.get_system(table, [b"k0", b"k1", b"k2"])
            expected = {k: v for (t, k), v in self.system.items() if t == table}
            assert got == expected


def test_store_agrees_with_dict_model(store_url_factory: Callable[[], str]) -> None:
    # Each example needs an empty store: durable backends get a fresh or wiped one.
    machine = type(
        "Machine",
        (StoreAgreesWithDict,),
        {"store_url": staticmethod(_fresh_urls(store_url_factory))},
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def _fresh_urls(store_url_factory: Callable[[], str]) -> Callable[[], str]:
    base = store_url_factory()
    counter = iter(range(1_000_000))

    def make() -> str:
        n = next(counter)
        if base.startswith("sqlite:///"):
            return base.replace(".db", f"-sm{n}.db")
        if base.startswith("cassandra://"):
            return _wiped_cassandra_url(base)
        return base

    return make


def _wiped_cassandra_url(url: str) -> str:
    from tests.cassandra_plugin import wipe_store

    wipe_store(url)
    return url
