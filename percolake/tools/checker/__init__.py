"""Isolation checker for recorded list-append histories (``percolake check``).

Reads histories in Elle's list-append format (JSON lines, one operation each:
``{"index": 0, "type": "invoke"|"ok"|"fail"|"info", "process": 3, "f": "txn", "value":
[["append", "k1", 7], ["r", "k2", [1, 2, 7]]]}``, an ``invoke`` followed by the same
process's completion; docs/chaos.md and docs/design/testing.md), infers each key's
version order and the ww/wr/rw dependency edges between committed
transactions, and reports the anomalies a consistency model forbids::

    from percolake.tools.checker import check_history, load_history

    report = check_history(load_history("history.jsonl"), "snapshot-isolation")
    if not report.valid:
        print(report.render_text())

``check_history`` also accepts decoded operations (a list of dicts), which is handy in
tests. Timestamp histories (the chaos ``timestamps`` workload) are checked by
``check_timestamp_history``: every timestamp unique and in real-time order.
``percolake.tools.checker.synthetic`` generates valid (or deliberately broken) histories for
tests and benchmarks.
"""

from percolake.tools.checker._check import (
    EXIT_ANOMALIES,
    EXIT_BAD_INPUT,
    EXIT_VALID,
    check_file,
    check_history,
    run_check,
)
from percolake.tools.checker._history import (
    Append,
    History,
    HistoryError,
    Key,
    MicroOp,
    Read,
    Txn,
    history_from_ops,
    load_history,
    parse_history,
)
from percolake.tools.checker._report import (
    ALLOWED_BY_MODEL,
    ANOMALY_TYPES,
    MODELS,
    Anomaly,
    CycleStep,
    Model,
    Report,
)
from percolake.tools.checker._timestamps import (
    TimestampCall,
    TimestampHistoryError,
    TimestampReport,
    TimestampViolation,
    check_timestamp_file,
    check_timestamp_history,
    is_timestamp_history,
)

__all__ = [
    "ALLOWED_BY_MODEL",
    "ANOMALY_TYPES",
    "EXIT_ANOMALIES",
    "EXIT_BAD_INPUT",
    "EXIT_VALID",
    "MODELS",
    "Anomaly",
    "Append",
    "CycleStep",
    "History",
    "HistoryError",
    "Key",
    "MicroOp",
    "Model",
    "Read",
    "Report",
    "TimestampCall",
    "TimestampHistoryError",
    "TimestampReport",
    "TimestampViolation",
    "Txn",
    "check_file",
    "check_history",
    "check_timestamp_file",
    "check_timestamp_history",
    "history_from_ops",
    "is_timestamp_history",
    "load_history",
    "parse_history",
    "run_check",
]
