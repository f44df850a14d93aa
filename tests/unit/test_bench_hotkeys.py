"""The hot-key benchmark (issue 28) is registered, spreads its clients over processes,
checks the counters exactly and reports the contract's figures from its runs."""

from __future__ import annotations

import pytest

from bench import bench_hotkeys as hk
from bench.__main__ import SUITES
from bench._results import Figure

pytestmark = pytest.mark.unit


def test_the_suite_is_registered() -> None:
    assert "bench.bench_hotkeys" in SUITES


def test_clients_are_spread_over_at_most_eight_processes() -> None:
    assert hk.layout(1) == [1]
    assert hk.layout(8) == [1] * 8
    assert hk.layout(64) == [8] * 8
    assert hk.layout(10) == [2, 2, 1, 1, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="clients"):
        hk.layout(0)


def _got(by_key: dict[int, int], unknown: dict[int, int] | None = None) -> hk.ClientRun:
    return hk.ClientRun(
        committed=sum(by_key.values()),
        committed_by_deadline=sum(by_key.values()),
        by_key=by_key,
        unknown_by_key=unknown or {},
        latencies_ms=[float(i) for i in range(1, 101)],
    )


def test_a_counter_off_by_one_is_found() -> None:
    got = _got({0: 5, 1: 3, 2: 0, 3: 7})
    assert hk.check_counters(got, {0: 5, 1: 3, 3: 7}) == []  # never written: 0
    assert hk.check_counters(got, {0: 5, 1: 2, 2: 0, 3: 8}) == [
        "counter 1 is 2, committed increments 3",
        "counter 3 is 8, committed increments 7",
    ]


def test_an_unknown_outcome_widens_the_check_by_one() -> None:
    got = _got({0: 5}, unknown={0: 1})
    assert hk.check_counters(got, {0: 6}) == []
    assert hk.check_counters(got, {0: 5}) == []
    assert hk.check_counters(got, {0: 7}) == ["counter 0 is 7, committed increments 5..6"]


def _run(clients: int, commits: int, failed: int = 0) -> hk.Run:
    got = _got({0: commits})
    got.failed = failed
    return hk.Run(clients, 4.0, got, {0: commits}, [])


def test_the_figures_are_the_contracts() -> None:
    sqlite = hk.Phase(hk.SQLITE)
    for mode in (hk.OPTIMISTIC, hk.PESSIMISTIC):
        sqlite.runs[mode, 1] = [_run(1, 400), _run(1, 440)]
        sqlite.runs[mode, 64] = [_run(64, 360, failed=2), _run(64, 352, failed=1)]
    cassandra = hk.Phase(hk.CASSANDRA3)
    cassandra.runs[hk.PESSIMISTIC, 1] = [_run(1, 100)]
    cassandra.runs[hk.PESSIMISTIC, 8] = [_run(8, 90)]
    figures = {
        f.name: f
        for phase in (sqlite, cassandra)
        for f in hk.phase_figures(phase)
        if isinstance(f, Figure)
    }
    ratio = figures["txn.hotkeys.pessimistic.clients64.vs_clients1.ratio"]
    assert ratio.value == pytest.approx((360 / 400 + 352 / 440) / 2, abs=1e-3)
    assert ratio.runs == 2  # runs paired
    assert figures["txn.hotkeys.pessimistic.cassandra3.clients8.vs_clients1.ratio"].value == 0.9
    failed = figures["txn.hotkeys.optimistic.clients64.failed"]
    assert (failed.value, failed.runs) == (3.0, 2)  # the sum over the runs
    assert figures["txn.hotkeys.optimistic.clients64.commits_per_s"].value == 89.0
    assert figures["txn.hotkeys.optimistic.clients64.p50_ms"].value == 51.0  # nearest rank
    assert figures["txn.hotkeys.optimistic.clients64.p99_ms"].value == 99.0
