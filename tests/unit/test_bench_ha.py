"""The availability benchmark's own arithmetic: when a writer counts as committing again
after a fault, how the writers of one fault and the faults of a run are summed up, and
which figures a run reports."""

from __future__ import annotations

import math

import pytest

from bench.__main__ import SUITES
from bench.bench_ha import (
    CASSANDRA,
    KILL,
    PAUSE,
    SQLITE,
    Fault,
    Phase,
    Record,
    WriterLog,
    fault_outage,
    main,
    phase_figures,
    writer_outage_s,
)
from bench.report import CONTRACT_FIGURES

pytestmark = pytest.mark.unit

FAULT = 100.0


def test_a_writer_is_back_at_the_end_of_its_first_good_commit_started_after_the_fault() -> None:
    records: list[Record] = [
        (99.0, 99.5, True),
        (99.5, 102.0, True),  # in flight at the fault: does not count, though it succeeded
        (102.0, 102.4, False),  # started after, failed
        (102.5, 103.25, True),  # the first good one started after the fault
        (103.25, 103.5, True),
    ]
    assert writer_outage_s(records, FAULT, until=200.0) == pytest.approx(3.25)


def test_a_commit_started_at_the_fault_instant_counts() -> None:
    assert writer_outage_s([(FAULT, 100.5, True)], FAULT, until=200.0) == pytest.approx(0.5)


def test_a_writer_without_a_good_commit_in_the_window_did_not_recover() -> None:
    records: list[Record] = [(99.0, 101.0, True), (101.0, 104.0, False), (104.0, 150.0, True)]
    assert writer_outage_s(records, FAULT, until=120.0) is None
    assert writer_outage_s(records, FAULT, until=150.0) == pytest.approx(50.0)
    assert writer_outage_s([], FAULT, until=120.0) is None


def test_a_fault_is_as_long_as_its_worst_writer_and_counts_failed_commits_in_its_window() -> None:
    writers: list[list[Record]] = [
        [(99.9, 100.1, False), (100.2, 102.0, True)],
        [(99.8, 104.0, False), (104.0, 104.5, True)],
        [(100.0, 100.3, True)],
        [(95.0, 99.0, False), (99.0, 103.0, True)],  # the failure before the fault is not its
    ]
    outage = fault_outage(KILL, writers, FAULT, until=110.0)
    assert outage.per_writer == pytest.approx((2.0, 4.5, 0.3, None))
    assert not outage.recovered
    # A writer that never came back counts as the whole window: the worst case.
    assert outage.max_s == pytest.approx(10.0)
    assert outage.median_s == pytest.approx((2.0 + 4.5) / 2)
    assert outage.failed == 2
    assert fault_outage(KILL, writers[:3], FAULT, until=110.0).max_s == pytest.approx(4.5)


def test_a_fault_needs_writers_and_a_window() -> None:
    with pytest.raises(ValueError):
        fault_outage(KILL, [], FAULT, until=110.0)
    with pytest.raises(ValueError):
        fault_outage(KILL, [[(101.0, 102.0, True)]], FAULT, until=FAULT)


def _phase(store: str) -> Phase:
    """Two kills and two pauses; each writer's next good commit after a fault ends
    2 s + 0.5 s * writer after it (3.5 s after the second pause)."""
    faults = [
        Fault(KILL, 100.0, 0, 1, 2.1, 103.0),
        Fault(PAUSE, 110.0, 1, 2, 2.0, 116.0),
        Fault(PAUSE, 120.0, 2, None, None, 126.0),
        Fault(KILL, 130.0, 2, 0, 2.3, 133.0),
    ]
    logs = []
    for w in range(4):
        records: list[Record] = []
        for f in faults:
            back = f.fault_at + (3.5 if f.fault_at == 120.0 else 2.0) + 0.5 * w
            records += [(f.fault_at - 0.1, f.fault_at + 0.5, False), (back - 0.2, back, True)]
        logs.append(WriterLog(records))
    return Phase(store, 2, faults, logs, ended_at=140.0)


def test_each_fault_is_looked_at_until_the_next_one() -> None:
    phase = _phase(SQLITE)
    kills, pauses = phase.outages(KILL), phase.outages(PAUSE)
    assert [o.fault_at for o in kills] == [100.0, 130.0]
    assert [o.window_s for o in kills] == [10.0, 10.0]
    assert [o.max_s for o in kills] == pytest.approx([3.5, 3.5])
    assert [o.max_s for o in pauses] == pytest.approx([3.5, 5.0])
    assert phase.commits() == (16, 16)


def test_commit_latency_away_from_faults_leaves_out_every_commit_an_outage_touched() -> None:
    phase = _phase(SQLITE)
    assert phase.quiet_latencies_s() == []  # every good commit above ends an outage
    phase.logs[0].records += [(105.0, 105.25, True), (107.0, 107.5, False), (108.0, 108.5, True)]
    phase.logs[1].records.append((129.0, 130.5, True))  # in flight at the fault at 130
    assert phase.quiet_latencies_s() == pytest.approx([0.25, 0.5])
    figures = {f.name: f for f in phase_figures(phase)}
    assert figures["ha.commit_p50_ms"].value == pytest.approx(375.0)


def test_a_run_reports_the_contract_figures_on_sqlite_and_the_cassandra_ones_apart() -> None:
    figures = {f.name: f for f in phase_figures(_phase(SQLITE))}
    contract = {n for n in CONTRACT_FIGURES if n.startswith("ha.")}
    assert contract == {"ha.leader_kill.outage_s", "ha.leader_pause.outage_s"}
    assert contract <= figures.keys()
    pause = figures["ha.leader_pause.outage_s"]
    assert pause.value == pytest.approx(4.25)
    assert (pause.runs, pause.unit) == (2, "s")
    assert pause.spread == pytest.approx((5.0 - 3.5) / 4.25, abs=1e-3)
    assert "took over during the pause in 1 of 2" in pause.note
    assert "write lock" in pause.note
    assert figures["ha.leader_pause.outage_max_s"].value == pytest.approx(5.0)
    assert figures["ha.leader_kill.takeover_s"].value == pytest.approx(2.2)
    assert figures["ha.leader_kill.failed_commits"].value == 8
    assert "2000 ms" in figures["ha.leader_kill.outage_s"].note
    for figure in figures.values():
        assert math.isfinite(figure.value) and figure.anchor.strip()
    cassandra = {f.name for f in phase_figures(_phase(CASSANDRA))}
    assert {"ha.cassandra.leader_kill.outage_s", "ha.cassandra.leader_pause.outage_s"} <= (
        cassandra
    )
    assert not contract & cassandra


def test_the_suite_is_registered_and_says_how_to_run_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert "bench.bench_ha" in SUITES
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--write" in out and "leader_kill" in out
