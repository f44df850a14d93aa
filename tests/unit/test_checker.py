"""The list-append history checker behind ``percolake check``.

Hand-made histories name the anomaly they exhibit; each is checked under both models.
Transactions are recorded one after another (the checker uses no real-time order), so
a history here is just the list of transactions and their outcomes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import percolake.tools.checker
from percolake import cli
from percolake.tools.checker import (
    EXIT_ANOMALIES,
    EXIT_BAD_INPUT,
    EXIT_VALID,
    HistoryError,
    Report,
    check_history,
    parse_history,
    run_check,
)
from percolake.tools.checker.synthetic import Workload, simulate, write_history

pytestmark = pytest.mark.unit

SI = "snapshot-isolation"
SER = "serializable"
Mop = tuple[str, object, object]


def r(key: object, values: Sequence[int] | None) -> Mop:
    return ("r", key, None if values is None else list(values))


def a(key: object, value: int) -> Mop:
    return ("append", key, value)


class Builder:
    """Records transactions as invoke/completion pairs, one process per transaction."""

    def __init__(self) -> None:
        self.ops: list[dict[str, object]] = []

    def op(self, op_type: str, process: int, value: object, **extra: object) -> None:
        self.ops.append(
            {
                "index": len(self.ops),
                "type": op_type,
                "process": process,
                "f": "txn",
                "value": value,
                **{k: v for k, v in extra.items() if v is not None},
            }
        )

    def txn(
        self,
        *mops: Mop,
        status: str = "ok",
        start_ts: int | None = None,
        commit_ts: int | None = None,
    ) -> Builder:
        process = len(self.ops) // 2
        invoke = [[f, k, None if f == "r" else v] for f, k, v in mops]
        self.op("invoke", process, invoke)
        value = [list(m) for m in mops] if status == "ok" else invoke
        self.op(status, process, value, start_ts=start_ts, commit_ts=commit_ts)
        return self


@dataclass(frozen=True)
class Spec:
    mops: tuple[Mop, ...]
    status: str = "ok"
    start_ts: int | None = None
    commit_ts: int | None = None


def history(*txns: tuple[Mop, ...] | Spec) -> list[dict[str, object]]:
    builder = Builder()
    for spec in txns:
        if isinstance(spec, Spec):
            builder.txn(
                *spec.mops, status=spec.status, start_ts=spec.start_ts, commit_ts=spec.commit_ts
            )
        else:
            builder.txn(*spec)
    return builder.ops


def failed(*mops: Mop) -> Spec:
    return Spec(mops, status="fail")


def info(*mops: Mop) -> Spec:
    return Spec(mops, status="info")


def timed(*mops: Mop, start: int, commit: int | None = None) -> Spec:
    return Spec(mops, start_ts=start, commit_ts=commit)


# name -> (history, anomaly types under SI, anomaly types under serializable)
CASES: dict[str, tuple[list[dict[str, object]], set[str], set[str]]] = {
    "G0 write cycle": (
        history(
            (a("x", 1), a("y", 2)),
            (a("x", 2), a("y", 1)),
            (r("x", [1, 2]), r("y", [1, 2])),
        ),
        {"G0"},
        {"G0"},
    ),
    "G1a aborted read": (
        history(failed(a("x", 1)), (r("x", [1]),)),
        {"G1a"},
        {"G1a"},
    ),
    # Reading T1's first of two appends is also a G-single cycle: the reader saw one
    # write of T1 and missed the other.
    "G1b intermediate read": (
        history((a("x", 1), a("x", 2)), (r("x", [1]),), (r("x", [1, 2]),)),
        {"G1b", "G-single"},
        {"G1b", "G-single"},
    ),
    "G1c circular information flow": (
        history((a("x", 1), r("y", [1])), (a("y", 1), r("x", [1]))),
        {"G1c"},
        {"G1c"},
    ),
    "G-single read skew": (
        history((a("x", 1), a("y", 1)), (r("x", []), r("y", [1]))),
        {"G-single"},
        {"G-single"},
    ),
    "G-nonadjacent": (
        history(
            (r("a", []), r("d", [1])),
            (a("a", 1), a("b", 1)),
            (r("b", [1]), r("c", [])),
            (a("c", 1), a("d", 1)),
        ),
        {"G-nonadjacent"},
        {"G-nonadjacent"},
    ),
    "G2-item write skew": (
        history(
            (r("x", []), r("y", []), a("x", 1)),
            (r("x", []), r("y", []), a("y", 1)),
        ),
        set(),
        {"G2-item"},
    ),
    # Both read [] and appended; the later read orders them, adding a G-single cycle.
    "lost update, ordered": (
        history(
            (r("x", []), a("x", 1)),
            (r("x", []), a("x", 2)),
            (r("x", [1, 2]),),
        ),
        {"lost-update", "G-single"},
        {"lost-update", "G-single"},
    ),
    # Nobody read the result: only the direct check sees that an update was lost
    # (the dependency graph has just the two rw edges of a write skew).
    "lost update, unordered": (
        history((r("x", []), a("x", 1)), (r("x", []), a("x", 2))),
        {"lost-update"},
        {"lost-update", "G2-item"},
    ),
    "internal inconsistency": (
        history((a("x", 1),), (r("x", [1]), a("x", 2), r("x", [1]))),
        {"internal"},
        {"internal"},
    ),
    # The read is also the only witness of x's order, [2, 1]: T1 appended 2 before T0
    # appended 1, yet read it.
    "internal, unknown prefix": (
        history((a("x", 1),), (a("x", 2), r("x", [2, 1]))),
        {"internal", "G1c"},
        {"internal", "G1c"},
    ),
    "duplicate elements": (
        history((a("x", 1),), (r("x", [1, 1]),)),
        {"duplicate-elements"},
        {"duplicate-elements"},
    ),
    "incompatible order": (
        history((a("x", 1),), (a("x", 2),), (r("x", [1, 2]),), (r("x", [2, 1]),)),
        {"incompatible-order"},
        {"incompatible-order"},
    ),
    "garbage read": (
        history((a("x", 1),), (r("x", [1, 9]),)),
        {"garbage-read"},
        {"garbage-read"},
    ),
    "timestamp order, wr seen before commit": (
        history(timed(a("x", 1), start=1, commit=5), timed(r("x", [1]), start=3)),
        {"timestamp-order"},
        {"timestamp-order"},
    ),
    "timestamp order, rw committed before snapshot": (
        history(timed(r("x", []), start=10), timed(a("x", 1), start=1, commit=2)),
        {"timestamp-order"},
        {"timestamp-order"},
    ),
    "timestamp order, ww against commit order": (
        history(
            timed(a("x", 1), start=1, commit=10),
            timed(a("x", 2), start=2, commit=5),
            timed(r("x", [1, 2]), start=20),
        ),
        {"timestamp-order"},
        {"timestamp-order"},
    ),
    "valid serial history": (
        history(
            timed(r("x", []), a("x", 1), start=1, commit=2),
            timed(r("x", [1]), a("y", 1), a("x", 2), start=3, commit=4),
            timed(r("x", [1, 2]), r("y", [1]), start=5),
            failed(a("x", 3)),
            timed(r("x", [1, 2]), a("x", 4), r("x", [1, 2, 4]), start=6, commit=7),
        ),
        set(),
        set(),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("model", [SI, SER])
def test_hand_made_history(name: str, model: str) -> None:
    ops, under_si, under_serializable = CASES[name]
    expected = under_si if model == SI else under_serializable
    report = check_history(ops, model)
    assert set(report.anomaly_types) == expected, report.render_text()
    assert report.valid == (not expected)


def test_write_skew_is_reported_as_allowed_under_snapshot_isolation() -> None:
    ops = CASES["G2-item write skew"][0]
    report = check_history(ops, SI)
    assert report.valid
    assert dict(report.allowed_counts) == {"G2-item": 1}
    (skew,) = report.allowed
    assert [step.edge for step in skew.cycle] == ["rw", "rw"]
    assert not check_history(ops, SER).valid


def test_cycle_anomaly_names_transactions_edges_and_keys() -> None:
    report = check_history(CASES["G-single read skew"][0], SI)
    (anomaly,) = report.anomalies
    assert anomaly.type == "G-single"
    assert sorted(t.id for t in anomaly.txns) == [0, 1]
    steps = {(s.source, s.target, s.edge, s.key) for s in anomaly.cycle}
    assert steps == {(1, 0, "rw", "x"), (0, 1, "wr", "y")}
    as_json = anomaly.to_json()
    assert as_json["type"] == "G-single"
    assert {t["process"] for t in as_json["txns"]} == {0, 1}  # type: ignore[attr-defined]
    assert "T1 -rw['x']-> T0" in anomaly.explanation
    assert any("initial empty state of key 'x'" in s.explanation for s in anomaly.cycle)


def test_g1a_names_the_failed_writer() -> None:
    (anomaly,) = check_history(CASES["G1a aborted read"][0], SI).anomalies
    assert [t.status for t in anomaly.txns] == ["ok", "fail"]
    assert anomaly.details["elements"] == [1]


def test_info_txn_whose_append_was_read_counts_as_committed() -> None:
    # T0's outcome is unknown, but T1 read its append to y: T0 committed, so T1 missing
    # its append to x is read skew.
    ops = history(info(a("x", 1), a("y", 1)), (r("x", []), r("y", [1])))
    report = check_history(ops, SI)
    assert report.anomaly_types == {"G-single"}
    assert report.stats["info_committed"] == 1


def test_info_txn_never_observed_is_ignored() -> None:
    ops = history(
        info(a("x", 1)),
        (r("x", []), a("y", 1)),
        (r("y", [1]), r("x", [])),
    )
    report = check_history(ops, SER)
    assert report.valid, report.render_text()
    assert report.stats["info_committed"] == 0
    assert report.stats["committed"] == 2


def test_unfinished_invocation_is_an_info_txn() -> None:
    ops = history((r("x", [1]),))
    ops.insert(0, {"index": 9, "type": "invoke", "process": 99, "f": "txn", "value": [a("x", 1)]})
    report = check_history(ops, SER)
    assert report.valid
    assert report.stats["info"] == 1
    assert report.stats["info_committed"] == 1


def test_failed_txn_never_read_is_harmless() -> None:
    ops = history(failed(a("x", 1)), (r("x", []),), (a("x", 2),), (r("x", [2]),))
    assert check_history(ops, SER).valid


def test_nemesis_operations_are_skipped() -> None:
    ops = history((a("x", 1),), (r("x", [1]),))
    ops.insert(1, {"type": "info", "process": "nemesis", "f": "start-partition", "value": None})
    report = check_history(ops, SER)
    assert report.valid
    assert report.stats["skipped_nemesis_operations"] == 1


def test_long_cycle_does_not_recurse() -> None:
    # T_i appends k_i and reads k_{i-1}; the last one misses T_0's append: one G-single
    # cycle through every transaction.
    size = 3000
    txns: list[tuple[Mop, ...]] = []
    for i in range(size):
        mops: list[Mop] = [a(f"k{i}", 1)]
        if i:
            mops.append(r(f"k{i - 1}", [1]))
        if i == size - 1:
            mops.append(r("k0", []))
        txns.append(tuple(mops))
    report = check_history(history(*txns), SI)
    assert dict(report.anomaly_counts) == {"G-single": 1}
    assert len(report.anomalies[0].cycle) == size
    assert "more steps" in report.render_text()


# --- parsing and bad input ------------------------------------------------------------


def write_lines(tmp_path: Path, lines: Sequence[str]) -> str:
    path = tmp_path / "history.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


INVOKE = '{"index": 0, "type": "invoke", "process": 1, "f": "txn", "value": [["append", "x", 1]]}'
OK = '{"index": 1, "type": "ok", "process": 1, "f": "txn", "value": [["append", "x", 1]]}'

BAD_INPUTS: dict[str, tuple[list[str], int, str]] = {
    "not json": ([INVOKE, "{not json"], 2, "not valid JSON"),
    "not an object": ([INVOKE, "[1, 2]"], 2, "expected a JSON object"),
    "missing process": ([INVOKE, '{"type": "ok", "f": "txn", "value": []}'], 2, "process"),
    "missing value": ([INVOKE, '{"type": "ok", "process": 1, "f": "txn"}'], 2, "value"),
    "process wrong type": (
        ['{"type": "invoke", "process": "p1", "f": "txn", "value": []}'],
        1,
        "must be an integer",
    ),
    "unknown op type": ([INVOKE, OK.replace('"ok"', '"crashed"')], 2, "unknown op type"),
    "completion without invoke": ([OK], 1, "without an invoke"),
    "double invoke": ([INVOKE, INVOKE.replace('"x", 1', '"x", 2')], 2, "invoked again"),
    "unknown micro-op": ([INVOKE.replace('"append"', '"write"')], 1, "unknown function"),
    "micro-op shape": ([INVOKE.replace('["append", "x", 1]', '["append", "x"]')], 1, "[f, key"),
    "append not int": ([INVOKE.replace('"x", 1', '"x", "one"')], 1, "must be an integer"),
    "key wrong type": ([INVOKE.replace('"x", 1', "[1], 1")], 1, "key must be"),
    "null read in ok": (
        [
            INVOKE.replace('"append", "x", 1', '"r", "x", null'),
            OK.replace('"append", "x", 1', '"r", "x", null'),
        ],
        2,
        "must be a list of integers",
    ),
    "ok does not match invoke": ([INVOKE, OK.replace('"x", 1', '"x", 2')], 2, "does not match"),
    "duplicate append": (
        [INVOKE, OK, INVOKE.replace('"index": 0', '"index": 2')],
        3,
        "appended to key 'x' again",
    ),
    "bad f": ([INVOKE.replace('"txn"', '"read"')], 1, 'unsupported "f"'),
    "bad timestamp": (
        [INVOKE, OK.replace('"value"', '"commit_ts": "late", "value"')],
        2,
        "commit_ts",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_exits_2_naming_the_line(name: str, tmp_path: Path) -> None:
    lines, line, problem = BAD_INPUTS[name]
    path = write_lines(tmp_path, lines)
    out = StringIO()
    assert run_check(path, SI, as_json=False, out=out) == EXIT_BAD_INPUT
    assert f"{path}:{line}:" in out.getvalue()
    assert problem in out.getvalue()
    with pytest.raises(HistoryError) as raised:
        parse_history(lines, source="h")
    assert raised.value.line == line


def test_missing_file_exits_2(tmp_path: Path) -> None:
    out = StringIO()
    assert run_check(str(tmp_path / "nope.jsonl"), SI, as_json=True, out=out) == EXIT_BAD_INPUT
    message = json.loads(out.getvalue())
    assert message["valid"] is None
    assert "nope.jsonl" in message["error"]


def test_unknown_model_is_bad_input(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [INVOKE, OK])
    out = StringIO()
    assert run_check(path, "linearizable", as_json=False, out=out) == EXIT_BAD_INPUT
    assert "unknown model" in out.getvalue()
    with pytest.raises(ValueError, match="unknown model"):
        check_history([], "linearizable")


def test_blank_lines_are_ignored_and_parse_keeps_ids(tmp_path: Path) -> None:
    parsed = parse_history([INVOKE, "", OK, "  "], source="h")
    (txn,) = parsed.txns
    assert (txn.id, txn.status, txn.line, txn.complete_index) == (0, "ok", 1, 1)
    assert isinstance(check_history(parsed, SER), Report)


# --- the command line -----------------------------------------------------------------


def test_cli_check_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "skew.jsonl"
    write_history(CASES["G2-item write skew"][0], path)

    assert cli.main(["check", str(path), "--model", "snapshot-isolation"]) == EXIT_VALID
    assert "VALID under snapshot-isolation" in capsys.readouterr().out

    assert cli.main(["check", str(path), "--model", "serializable", "--json"]) == EXIT_ANOMALIES
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert report["model"] == "serializable"
    (anomaly,) = report["anomalies"]
    assert anomaly["type"] == "G2-item"
    assert [t["id"] for t in anomaly["txns"]] in ([0, 1], [1, 0])
    assert [step["type"] for step in anomaly["cycle"]] == ["rw", "rw"]
    assert report["stats"]["txns"] == 2


def test_cli_check_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_lines(tmp_path, [INVOKE, "oops"])
    assert cli.main(["check", path]) == EXIT_BAD_INPUT
    assert f"{path}:2: not valid JSON" in capsys.readouterr().out


def test_text_report_summarises() -> None:
    report = check_history(CASES["G1c circular information flow"][0], SI)
    text = report.render_text()
    assert "INVALID under snapshot-isolation" in text
    assert "G1c: 1" in text
    assert "observed" in text


def test_public_exports() -> None:
    assert {
        "check_history",
        "check_file",
        "run_check",
        "load_history",
        "parse_history",
        "Report",
        "Anomaly",
        "HistoryError",
    } <= set(percolake.tools.checker.__all__)


# --- properties -----------------------------------------------------------------------

KEYS = ["x", "y", 0, 1]
serial_txn = st.tuples(
    st.lists(st.tuples(st.sampled_from(["r", "append"]), st.sampled_from(KEYS)), max_size=5),
    st.sampled_from(["ok", "ok", "ok", "fail", "info-applied", "info-lost"]),
    st.integers(min_value=0, max_value=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(serial_txn, max_size=25), st.booleans())
def test_serial_executions_are_valid_under_both_models(
    txns: list[tuple[list[tuple[str, object]], str, int]], with_timestamps: bool
) -> None:
    state: dict[object, list[int]] = {}
    next_value: dict[object, int] = {}
    ops: list[dict[str, object]] = []
    clock = 0
    for mops, outcome, process in txns:
        invoke: list[list[object]] = []
        for f, key in mops:
            if f == "r":
                invoke.append(["r", key, None])
            else:
                next_value[key] = next_value.get(key, 0) + 1
                invoke.append(["append", key, next_value[key]])
        ops.append(
            {"index": len(ops), "type": "invoke", "process": process, "f": "txn", "value": invoke}
        )
        applied = outcome in ("ok", "info-applied")
        scratch = {k: list(v) for k, v in state.items()}
        completion: list[list[object]] = []
        for kind, key, value in invoke:
            current = scratch.setdefault(key, [])
            if kind == "r":
                completion.append(["r", key, list(current)])
            else:
                assert isinstance(value, int)
                current.append(value)
                completion.append(["append", key, value])
        if applied:
            state = scratch
        clock += 2
        done: dict[str, object] = {"index": len(ops), "process": process, "f": "txn"}
        if outcome == "ok":
            done.update(type="ok", value=completion)
            if with_timestamps:
                done.update(start_ts=clock - 1, commit_ts=clock)
        else:
            done.update(type="fail" if outcome == "fail" else "info", value=invoke)
        ops.append(done)
    for model in (SI, SER):
        report = check_history(ops, model)
        assert report.valid, report.render_text()
        assert not report.allowed_counts


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.sampled_from([SI, SER]))
def test_simulated_concurrent_executions_are_valid_under_their_model(
    seed: int, isolation: str
) -> None:
    ops = simulate(
        Workload(
            txns=150,
            processes=6,
            active_keys=4,
            max_writes_per_key=8,
            isolation=isolation,  # type: ignore[arg-type]
            abort_fraction=0.05,
            info_fraction=0.05,
            seed=seed,
        )
    )
    report = check_history(ops, isolation)
    assert report.valid, report.render_text()
    assert check_history(ops, SI).valid


def test_simulated_bugs_are_caught() -> None:
    lost = simulate(Workload(txns=400, active_keys=3, lost_update_bug_fraction=1.0, seed=7))
    assert {"lost-update"} <= check_history(lost, SI).anomaly_types
    stale = simulate(Workload(txns=400, active_keys=3, stale_read_bug_fraction=0.2, seed=7))
    found = check_history(stale, SI).anomaly_types
    assert "timestamp-order" in found
    assert found & {"G-single", "G-nonadjacent"}
