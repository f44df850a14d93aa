"""The checker's entry points: check a history, check a file, run ``percolake check``."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import TextIO

from percolake.tools.checker._cycles import find_cycles
from percolake.tools.checker._history import History, HistoryError, history_from_ops, load_history
from percolake.tools.checker._infer import infer
from percolake.tools.checker._report import (
    ALLOWED_BY_MODEL,
    ANOMALY_TYPES,
    MAX_EXAMPLES_PER_TYPE,
    MODELS,
    Anomaly,
    Model,
    Report,
)
from percolake.tools.checker._timestamps import (
    TimestampHistoryError,
    check_timestamp_file,
    is_timestamp_history,
)

log = logging.getLogger(__name__)

EXIT_VALID = 0
EXIT_ANOMALIES = 1
EXIT_BAD_INPUT = 2


def check_history(
    history: History | Iterable[Mapping[str, object]],
    model: Model | str = "snapshot-isolation",
) -> Report:
    """Check a history against ``model`` ("snapshot-isolation" or "serializable").

    ``history`` is a parsed :class:`History` or decoded operations (dicts in the
    JSON-lines format). Raises :class:`HistoryError` for malformed operations and
    ``ValueError`` for an unknown model.
    """
    checked_model = _model(model)
    started = time.perf_counter()
    if not isinstance(history, History):
        history = history_from_ops(history)
    inference = infer(history)
    inferred = time.perf_counter()
    search = find_cycles(inference.graph, include_g2=True)
    searched = time.perf_counter()

    allowed_types = ALLOWED_BY_MODEL[checked_model]
    found = [*inference.anomalies, *search.anomalies]
    forbidden = [a for a in found if a.type not in allowed_types]
    allowed = [a for a in found if a.type in allowed_types]

    txns = history.txns
    stats: dict[str, object] = {
        "operations": history.operations,
        "txns": len(txns),
        "ok": sum(1 for t in txns if t.status == "ok"),
        "fail": sum(1 for t in txns if t.status == "fail"),
        "info": sum(1 for t in txns if t.status == "info"),
        **inference.stats,
        "edges": inference.graph.edge_counts(),
        **search.stats,
        "infer_seconds": round(inferred - started, 4),
        "cycle_search_seconds": round(searched - inferred, 4),
    }
    if history.skipped_nemesis_operations:
        stats["skipped_nemesis_operations"] = history.skipped_nemesis_operations
    stats["check_seconds"] = round(time.perf_counter() - started, 4)
    report = Report(
        model=checked_model,
        anomalies=_examples(forbidden),
        anomaly_counts=_counts(forbidden),
        allowed=_examples(allowed),
        allowed_counts=_counts(allowed),
        stats=stats,
        source=history.source,
    )
    log.debug(
        "checked %s under %s: %d anomalies in %.2f s",
        history.source,
        checked_model,
        len(forbidden),
        stats["check_seconds"],
    )
    return report


def check_file(path: str | os.PathLike[str], model: Model | str = "snapshot-isolation") -> Report:
    """Load and check a JSON-lines history file; parse time is included in the stats."""
    checked_model = _model(model)
    started = time.perf_counter()
    history = load_history(path)
    parsed = time.perf_counter()
    report = check_history(history, checked_model)
    stats = dict(report.stats)
    stats["parse_seconds"] = round(parsed - started, 4)
    stats["check_seconds"] = round(time.perf_counter() - started, 4)
    return Report(
        model=report.model,
        anomalies=report.anomalies,
        anomaly_counts=report.anomaly_counts,
        allowed=report.allowed,
        allowed_counts=report.allowed_counts,
        stats=stats,
        source=report.source,
    )


def run_check(path: str, model: str, *, as_json: bool, out: TextIO) -> int:
    """``percolake check``: write the report to ``out``; exit 0 valid, 1 anomalies, 2 bad input.

    A timestamps history (the chaos ``timestamps`` workload's ``ts`` calls) is checked
    for unique timestamps in real-time order instead; ``model`` does not apply to it.
    """
    if is_timestamp_history(path):
        try:
            stamps = check_timestamp_file(path)
        except TimestampHistoryError as exc:
            return _bad_input(f"bad history: {exc}", as_json, out)
        except OSError as exc:
            return _bad_input(f"cannot read {path}: {exc.strerror or exc}", as_json, out)
        out.write(stamps.render_json() + "\n" if as_json else stamps.render_text())
        return EXIT_VALID if stamps.valid else EXIT_ANOMALIES
    try:
        report = check_file(path, model)
    except HistoryError as exc:
        return _bad_input(f"bad history: {exc}", as_json, out)
    except ValueError as exc:
        return _bad_input(str(exc), as_json, out)
    except UnicodeDecodeError as exc:
        return _bad_input(f"{path}: not UTF-8 text: {exc.reason}", as_json, out)
    except OSError as exc:
        return _bad_input(f"cannot read {path}: {exc.strerror or exc}", as_json, out)
    out.write(report.render_json() + "\n" if as_json else report.render_text())
    return EXIT_VALID if report.valid else EXIT_ANOMALIES


def _bad_input(message: str, as_json: bool, out: TextIO) -> int:
    log.debug("percolake check: %s", message)
    if as_json:
        out.write(json.dumps({"valid": None, "error": message}) + "\n")
    else:
        out.write(f"percolake check: {message}\n")
    return EXIT_BAD_INPUT


def _model(model: str) -> Model:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: expected one of {', '.join(MODELS)}")
    return model


def _order(anomaly_type: str) -> int:
    return (
        ANOMALY_TYPES.index(anomaly_type) if anomaly_type in ANOMALY_TYPES else len(ANOMALY_TYPES)
    )


def _counts(anomalies: list[Anomaly]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for anomaly in sorted(anomalies, key=lambda a: _order(a.type)):
        counts[anomaly.type] = counts.get(anomaly.type, 0) + 1
    return counts


def _examples(anomalies: list[Anomaly]) -> tuple[Anomaly, ...]:
    kept: list[Anomaly] = []
    per_type: dict[str, int] = {}
    for anomaly in sorted(anomalies, key=lambda a: _order(a.type)):
        if per_type.get(anomaly.type, 0) < MAX_EXAMPLES_PER_TYPE:
            per_type[anomaly.type] = per_type.get(anomaly.type, 0) + 1
            kept.append(anomaly)
    return tuple(kept)
