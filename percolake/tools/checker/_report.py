"""What a check finds: anomalies, the report, and how both are rendered."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from percolake.tools.checker._history import Key, Txn

Model: TypeAlias = Literal["snapshot-isolation", "serializable"]
MODELS: Final[tuple[Model, ...]] = ("snapshot-isolation", "serializable")

# Anomaly names. Cycle anomalies follow Adya; the rest follow Elle's list-append checker.
G0: Final = "G0"
G1A: Final = "G1a"
G1B: Final = "G1b"
G1C: Final = "G1c"
G_SINGLE: Final = "G-single"
G_NONADJACENT: Final = "G-nonadjacent"
G2_ITEM: Final = "G2-item"
LOST_UPDATE: Final = "lost-update"
INTERNAL: Final = "internal"
DUPLICATE_ELEMENTS: Final = "duplicate-elements"
INCOMPATIBLE_ORDER: Final = "incompatible-order"
GARBAGE_READ: Final = "garbage-read"
TIMESTAMP_ORDER: Final = "timestamp-order"

ANOMALY_TYPES: Final[tuple[str, ...]] = (
    G0,
    G1A,
    G1B,
    G1C,
    G_SINGLE,
    G_NONADJACENT,
    G2_ITEM,
    LOST_UPDATE,
    INTERNAL,
    DUPLICATE_ELEMENTS,
    INCOMPATIBLE_ORDER,
    GARBAGE_READ,
    TIMESTAMP_ORDER,
)

# Snapshot isolation admits write skew, which shows up as cycles whose anti-dependency
# edges come in adjacent pairs (G2-item); serializability admits no cycle at all.
ALLOWED_BY_MODEL: Final[Mapping[Model, frozenset[str]]] = {
    "snapshot-isolation": frozenset({G2_ITEM}),
    "serializable": frozenset(),
}

# A history with a systematic bug can hold millions of anomalies; the report keeps this
# many examples of each type (all are counted) so it stays readable and small.
MAX_EXAMPLES_PER_TYPE: Final = 20
# Text reports explain this many steps of each cycle; JSON reports carry them all.
_STEPS_SHOWN: Final = 12


@dataclass(frozen=True, slots=True)
class CycleStep:
    """One edge of a dependency cycle: ``source`` -``edge``-> ``target`` because of ``key``."""

    source: int
    target: int
    edge: Literal["ww", "wr", "rw"]
    key: Key | None
    explanation: str

    def to_json(self) -> dict[str, object]:
        return {
            "from": self.source,
            "to": self.target,
            "type": self.edge,
            "key": self.key,
            "explanation": self.explanation,
        }


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One anomaly: its type, the transactions involved and why it is one.

    ``txns`` lists the transactions in the order the explanation names them (for a cycle,
    cycle order). ``details`` carries type-specific JSON data (key, elements, timestamps).
    """

    type: str
    txns: tuple[Txn, ...]
    explanation: str
    cycle: tuple[CycleStep, ...] = ()
    details: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "type": self.type,
            "txns": [txn.to_json() for txn in self.txns],
            "explanation": self.explanation,
        }
        if self.cycle:
            out["cycle"] = [step.to_json() for step in self.cycle]
        out.update(self.details)
        return out


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of a check.

    ``anomalies`` holds examples of what the model forbids (``anomaly_counts`` counts all
    of them), ``allowed`` examples of anomalies found that the model permits, such as
    write skew under snapshot isolation. ``valid`` is true when nothing forbidden was found.
    """

    model: Model
    anomalies: tuple[Anomaly, ...]
    anomaly_counts: Mapping[str, int]
    allowed: tuple[Anomaly, ...]
    allowed_counts: Mapping[str, int]
    stats: Mapping[str, object]
    source: str = "<history>"

    @property
    def valid(self) -> bool:
        return not self.anomaly_counts

    @property
    def anomaly_types(self) -> frozenset[str]:
        return frozenset(self.anomaly_counts)

    def to_json(self) -> dict[str, object]:
        return {
            "valid": self.valid,
            "model": self.model,
            "history": self.source,
            "anomaly_types": sorted(self.anomaly_counts),
            "anomaly_counts": dict(self.anomaly_counts),
            "anomalies": [a.to_json() for a in self.anomalies],
            "allowed_anomaly_counts": dict(self.allowed_counts),
            "allowed_anomalies": [a.to_json() for a in self.allowed],
            "stats": dict(self.stats),
        }

    def render_json(self) -> str:
        return json.dumps(self.to_json(), default=str)

    def render_text(self, examples_per_type: int = 3) -> str:
        stats = self.stats
        verdict = "VALID" if self.valid else "INVALID"
        lines = [
            f"{self.source}: {verdict} under {self.model}: {stats.get('txns', 0)} transactions "
            f"(ok {stats.get('ok', 0)}, fail {stats.get('fail', 0)}, info {stats.get('info', 0)}"
            f"), {sum(self.anomaly_counts.values())} anomalies, checked in "
            f"{stats.get('check_seconds', 0.0):.2f} s"
        ]
        lines += _render_group(self.anomalies, self.anomaly_counts, examples_per_type)
        if self.allowed_counts:
            lines.append(f"allowed under {self.model} (not counted against it):")
            lines += _render_group(self.allowed, self.allowed_counts, 1)
        return "\n".join(lines) + "\n"


def _render_group(
    anomalies: Sequence[Anomaly], counts: Mapping[str, int], examples_per_type: int
) -> list[str]:
    lines: list[str] = []
    for anomaly_type, count in counts.items():
        lines.append(f"  {anomaly_type}: {count}")
        examples = [a for a in anomalies if a.type == anomaly_type][:examples_per_type]
        for anomaly in examples:
            lines.append(f"    - {anomaly.explanation}")
            lines.extend(f"        {step.explanation}" for step in anomaly.cycle[:_STEPS_SHOWN])
            if len(anomaly.cycle) > _STEPS_SHOWN:
                lines.append(f"        ... {len(anomaly.cycle) - _STEPS_SHOWN} more steps")
    return lines
