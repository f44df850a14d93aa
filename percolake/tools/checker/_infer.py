"""Inference over a list-append history: version orders, dependency edges, and the
anomalies visible without a cycle search.

List-append makes the version order of every key observable: each read returns the whole
list, so the longest read of a key orders every append it contains, and every other read
must be a prefix of it. From that order come the edges of Adya's direct serialization
graph between committed transactions (``ok`` ones, plus ``info`` ones whose appends
somebody read):

- ``ww``: T2 appended the element right after T1's in the version order;
- ``wr``: T2 read a state whose last element T1 appended;
- ``rw``: T1 read a state whose next element T2 appended (T2 overwrote what T1 saw).

An append nobody read still came after every element somebody read (lists only grow),
so it gets a ``ww`` edge from the writer of the last observed element and ``rw`` edges
from the readers of the full observed list.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from percolake.tools.checker._history import Append, History, Key, Read, Txn
from percolake.tools.checker._report import (
    DUPLICATE_ELEMENTS,
    G1A,
    G1B,
    GARBAGE_READ,
    INCOMPATIBLE_ORDER,
    INTERNAL,
    LOST_UPDATE,
    TIMESTAMP_ORDER,
    Anomaly,
)

log = logging.getLogger(__name__)

WW: Final = 1
WR: Final = 2
RW: Final = 4
DEPENDENCY: Final = WW | WR
EdgeName = Literal["ww", "wr", "rw"]
EDGE_NAMES: Final[dict[int, EdgeName]] = {WW: "ww", WR: "wr", RW: "rw"}

# How many readers an incompatible-order anomaly lists besides the longest read's.
_INCOMPATIBLE_EXAMPLES: Final = 5
_NO_WRITER: Final = -1


@dataclass(slots=True)
class KeyOrder:
    """The inferred version order of one key: ``values`` in append order."""

    values: list[int]
    position: dict[int, int]
    # Some read repeated an element (a duplicate-elements anomaly); values has it once.
    deduplicated: bool = False

    def state_after(self, read: Sequence[int]) -> int:
        """How many elements of the order a read that is a prefix of it observed."""
        return len(set(read)) if self.deduplicated else len(read)


@dataclass(slots=True)
class DependencyGraph:
    """Typed dependency edges between committed transactions.

    ``successors[a]`` maps each successor ``b`` of transaction ``a`` to a bit mask of
    edge types (``WW | WR | RW``). Transactions that did not commit have no edges.
    """

    txns: Sequence[Txn]
    committed: list[bool]
    successors: list[dict[int, int]]
    orders: dict[Key, KeyOrder]
    writer: dict[Key, dict[int, int]]

    def edge_counts(self) -> dict[str, int]:
        counts = {"ww": 0, "wr": 0, "rw": 0}
        for edges in self.successors:
            for mask in edges.values():
                for bit, name in EDGE_NAMES.items():
                    if mask & bit:
                        counts[name] += 1
        return counts

    def explain(self, source: int, target: int, edge: EdgeName) -> tuple[Key | None, str]:
        """Which key makes ``source -edge-> target`` an edge, in words."""
        a, b = self.txns[source], self.txns[target]
        if edge == "wr":
            for op in b.ops:
                if isinstance(op, Read) and op.values:
                    element = op.values[-1]
                    if self.writer.get(op.key, {}).get(element) == source:
                        return op.key, (
                            f"{b.name} observed {a.name}'s append of {element} to key {op.key!r}"
                        )
        else:
            # For ww and rw alike the target appended the element that follows.
            for op in b.ops:
                if not isinstance(op, Append):
                    continue
                before = self._state_before(op)
                if before is None:
                    continue
                if edge == "ww":
                    found = self._ww_explanation(a, b, op, before)
                else:
                    found = self._rw_explanation(a, b, op, before)
                if found is not None:
                    return op.key, found
        return None, f"{a.name} -{edge}-> {b.name}"

    def _state_before(self, append: Append) -> int | None:
        """How many observed elements precede ``append`` in its key's order."""
        order = self.orders.get(append.key)
        if order is None:
            return None
        index = order.position.get(append.value)
        return len(order.values) if index is None else index

    def _ww_explanation(self, a: Txn, b: Txn, append: Append, before: int) -> str | None:
        if before == 0:
            return None
        previous = self.orders[append.key].values[before - 1]
        if self.writer[append.key].get(previous) != a.id:
            return None
        return (
            f"{b.name} appended {append.value} after {a.name} appended {previous} "
            f"to key {append.key!r}"
        )

    def _rw_explanation(self, a: Txn, b: Txn, append: Append, before: int) -> str | None:
        order = self.orders[append.key]
        for op in a.ops:
            if not (isinstance(op, Read) and op.key == append.key and op.values is not None):
                continue
            if not _is_prefix(op.values, order.values) or order.state_after(op.values) != before:
                continue
            if not op.values:
                return (
                    f"{a.name} observed the initial empty state of key {append.key!r}, "
                    f"which {b.name} overwrote by appending {append.value}"
                )
            return (
                f"{a.name} read key {append.key!r} up to {op.values[-1]} and did not observe "
                f"{b.name}'s append of {append.value}"
            )
        return None


@dataclass(slots=True)
class Inference:
    graph: DependencyGraph
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)


def infer(history: History) -> Inference:
    """Infer version orders and edges; find every anomaly that needs no cycle search."""
    return _Inferrer(history).run()


def _is_prefix(read: Sequence[int], values: Sequence[int]) -> bool:
    return len(read) <= len(values) and list(read) == list(values[: len(read)])


class _Inferrer:
    def __init__(self, history: History) -> None:
        self.txns = history.txns
        self.committed = [txn.status == "ok" for txn in self.txns]
        self.anomalies: list[Anomaly] = []
        # key -> element -> id of the transaction that appended it (any outcome)
        self.writer: dict[Key, dict[int, int]] = {}
        # key -> elements that their writer followed with another append to the same key
        self.intermediate: dict[Key, set[int]] = {}
        # key -> (reader id, elements read), reads of ok transactions only
        self.reads: dict[Key, list[tuple[int, list[int]]]] = {}
        # key -> (reader id, number of observed elements), reads that fit the order
        self.readers: dict[Key, list[tuple[int, int]]] = {}
        self.orders: dict[Key, KeyOrder] = {}
        self.successors: list[dict[int, int]] = [{} for _ in self.txns]
        self.info_committed = 0

    def run(self) -> Inference:
        self.index_appends()
        self.scan_committed_txns()
        for key, key_reads in self.reads.items():
            self.order_key(key, key_reads)
        self.link()
        graph = DependencyGraph(
            self.txns, self.committed, self.successors, self.orders, self.writer
        )
        self.check_timestamps(graph)
        stats = {
            "keys": len(self.writer.keys() | self.reads.keys()),
            "info_committed": self.info_committed,
            "committed": sum(self.committed),
        }
        return Inference(graph, self.anomalies, stats)

    def index_appends(self) -> None:
        for txn in self.txns:
            last: dict[Key, int] = {}
            for op in txn.ops:
                if isinstance(op, Append):
                    self.writer.setdefault(op.key, {})[op.value] = txn.id
                    previous = last.get(op.key)
                    if previous is not None:
                        self.intermediate.setdefault(op.key, set()).add(previous)
                    last[op.key] = op.value

    def scan_committed_txns(self) -> None:
        """Per-transaction checks of ok transactions, and collection of their reads."""
        # (key, length, last element) of a read followed by an append -> the readers
        read_then_append: dict[tuple[Key, int, int | None], list[int]] = {}
        for txn in self.txns:
            if txn.status != "ok":
                continue
            keys_seen: set[Key] = set()
            repeated = False
            first_read: dict[Key, list[int]] = {}
            appended: set[Key] = set()
            for op in txn.ops:
                key = op.key
                if key in keys_seen:
                    repeated = True
                keys_seen.add(key)
                if isinstance(op, Read):
                    values = op.values
                    assert values is not None  # the parser requires reads in ok completions
                    self.reads.setdefault(key, []).append((txn.id, values))
                    if len(values) > 1 and len(set(values)) != len(values):
                        self.duplicate_elements(txn, op.key, values)
                    if key not in appended and key not in first_read:
                        first_read[key] = values
                elif key not in appended:
                    appended.add(key)
                    seen = first_read.get(key)
                    if seen is not None:
                        version = (key, len(seen), seen[-1] if seen else None)
                        read_then_append.setdefault(version, []).append(txn.id)
            if repeated:
                self.internal_consistency(txn)
        for (key, length, last), txn_ids in read_then_append.items():
            if len(txn_ids) > 1:
                self.lost_update(key, length, last, txn_ids)

    def duplicate_elements(self, txn: Txn, key: Key, values: list[int]) -> None:
        counts: dict[int, int] = {}
        for element in values:
            counts[element] = counts.get(element, 0) + 1
        duplicates = {element: n for element, n in counts.items() if n > 1}
        self.anomalies.append(
            Anomaly(
                DUPLICATE_ELEMENTS,
                (txn,),
                f"{txn.describe()} read key {key!r} with elements appearing more than once: "
                f"{duplicates}",
                details={"key": key, "read": values, "duplicates": list(duplicates)},
            )
        )

    def internal_consistency(self, txn: Txn) -> None:
        """A read must agree with the transaction's own earlier reads and appends of the key.

        ``expected[key]`` is ``(known, elements)``: the whole list when ``known``, otherwise
        only the suffix this transaction appended since it last knew the list.
        """
        expected: dict[Key, tuple[bool, list[int]]] = {}
        for position, op in enumerate(txn.ops):
            if isinstance(op, Append):
                known, elements = expected.get(op.key, (False, []))
                expected[op.key] = (known, [*elements, op.value])
                continue
            values = op.values
            assert values is not None
            state = expected.get(op.key)
            if state is not None:
                known, elements = state
                if known:
                    consistent = values == elements
                else:
                    tail = values[len(values) - len(elements) :] if elements else []
                    consistent = len(values) >= len(elements) and tail == elements
                if not consistent:
                    shown = elements if known else ["...", *elements]
                    self.anomalies.append(
                        Anomaly(
                            INTERNAL,
                            (txn,),
                            f"{txn.describe()} read key {op.key!r} as {values} at micro-op "
                            f"{position}, but its own earlier operations imply {shown}",
                            details={
                                "key": op.key,
                                "mop_index": position,
                                "read": values,
                                "expected": shown,
                            },
                        )
                    )
                    return
            expected[op.key] = (True, list(values))

    def lost_update(self, key: Key, length: int, last: int | None, txn_ids: list[int]) -> None:
        txns = tuple(self.txns[i] for i in txn_ids)
        state = "the initial empty state" if last is None else f"a state ending in {last}"
        self.anomalies.append(
            Anomaly(
                LOST_UPDATE,
                txns,
                f"{len(txns)} committed transactions ({', '.join(t.name for t in txns)}) "
                f"all read {state} of key {key!r} (length {length}) and then appended to it",
                details={"key": key, "read_length": length, "read_last_element": last},
            )
        )

    def order_key(self, key: Key, key_reads: list[tuple[int, list[int]]]) -> None:
        """Infer ``key``'s version order, and check every read of it against that order."""
        longest_reader, longest = max(key_reads, key=lambda read: len(read[1]))
        deduplicated = len(set(longest)) != len(longest)
        values = list(dict.fromkeys(longest)) if deduplicated else longest
        order = KeyOrder(values, {e: i for i, e in enumerate(values)}, deduplicated)
        self.orders[key] = order
        writers = self.writer.get(key, {})
        intermediate = self.intermediate.get(key, set())
        compatible: list[tuple[int, int]] = []
        incompatible: list[tuple[int, list[int]]] = []
        size = len(longest)
        for reader, read in key_reads:
            length = len(read)
            if length == 0:
                compatible.append((reader, 0))
                continue
            if length <= size and read[-1] == longest[length - 1] and read == longest[:length]:
                compatible.append((reader, order.state_after(read)))
            else:
                incompatible.append((reader, read))
            last = read[-1]
            if last in intermediate and writers.get(last, reader) != reader:
                self.intermediate_read(key, reader, read, writers[last])
        self.readers[key] = compatible
        if incompatible:
            self.incompatible_order(key, longest_reader, longest, incompatible)
        self.observe(key, order, compatible, incompatible)

    def observe(
        self,
        key: Key,
        order: KeyOrder,
        compatible: list[tuple[int, int]],
        incompatible: list[tuple[int, list[int]]],
    ) -> None:
        """Elements somebody read: promote info writers, flag failed and unknown ones."""
        writers = self.writer.get(key, {})
        bad_positions: list[int] = []
        for i, element in enumerate(order.values):
            if self.classify_observed(writers.get(element, _NO_WRITER)):
                bad_positions.append(i)
        if bad_positions:
            first_bad = bad_positions[0]
            for reader, observed in compatible:
                if observed > first_bad:
                    seen = [order.values[i] for i in bad_positions if i < observed]
                    self.bad_read(key, reader, seen)
        for reader, read in incompatible:
            seen = [e for e in read if self.classify_observed(writers.get(e, _NO_WRITER))]
            if seen:
                self.bad_read(key, reader, seen)

    def classify_observed(self, writer: int) -> bool:
        """Promote an observed info writer to committed; True when the writer is bad."""
        if writer == _NO_WRITER:
            return True
        status = self.txns[writer].status
        if status == "info" and not self.committed[writer]:
            self.committed[writer] = True
            self.info_committed += 1
        return status == "fail"

    def bad_read(self, key: Key, reader_id: int, elements: list[int]) -> None:
        reader = self.txns[reader_id]
        writers = self.writer.get(key, {})
        aborted = [e for e in elements if e in writers]
        garbage = [e for e in elements if e not in writers]
        if aborted:
            txns = (reader, *dict.fromkeys(self.txns[writers[e]] for e in aborted))
            self.anomalies.append(
                Anomaly(
                    G1A,
                    txns,
                    f"{reader.describe()} read elements {aborted} of key {key!r} appended by "
                    f"failed transaction(s) {', '.join(t.name for t in txns[1:])}",
                    details={"key": key, "elements": aborted},
                )
            )
        if garbage:
            self.anomalies.append(
                Anomaly(
                    GARBAGE_READ,
                    (reader,),
                    f"{reader.describe()} read elements {garbage} of key {key!r} that no "
                    "transaction ever appended",
                    details={"key": key, "elements": garbage},
                )
            )

    def intermediate_read(self, key: Key, reader_id: int, read: list[int], writer_id: int) -> None:
        reader, writer = self.txns[reader_id], self.txns[writer_id]
        own = [op.value for op in writer.ops if isinstance(op, Append) and op.key == key]
        self.anomalies.append(
            Anomaly(
                G1B,
                (reader, writer),
                f"{reader.describe()} read key {key!r} ending at {read[-1]}, an intermediate "
                f"state of {writer.describe()}, which appended {own} to it",
                details={"key": key, "read": read, "element": read[-1]},
            )
        )

    def incompatible_order(
        self,
        key: Key,
        longest_reader: int,
        longest: list[int],
        incompatible: list[tuple[int, list[int]]],
    ) -> None:
        examples = incompatible[:_INCOMPATIBLE_EXAMPLES]
        txns = tuple(
            dict.fromkeys([self.txns[longest_reader], *(self.txns[r] for r, _ in examples)])
        )
        self.anomalies.append(
            Anomaly(
                INCOMPATIBLE_ORDER,
                txns,
                f"{len(incompatible)} read(s) of key {key!r} are not a prefix of its longest "
                f"read {longest} (by {self.txns[longest_reader].name}); e.g. "
                f"{self.txns[examples[0][0]].name} read {examples[0][1]}",
                details={"key": key, "values": [longest, *(read for _, read in examples)]},
            )
        )

    def link(self) -> None:
        """Add ww, wr and rw edges between committed transactions, key by key."""
        committed = self.committed
        successors = self.successors
        unobserved: dict[Key, list[int]] = {}
        for key, writers in self.writer.items():
            order = self.orders.get(key)
            if order is None:
                continue
            position = order.position
            for element, txn_id in writers.items():
                if committed[txn_id] and element not in position:
                    unobserved.setdefault(key, []).append(txn_id)
        for key, order in self.orders.items():
            writers = self.writer.get(key, {})
            chain = [writers.get(element, _NO_WRITER) for element in order.values]
            chain = [w if w != _NO_WRITER and committed[w] else _NO_WRITER for w in chain]
            late = unobserved.get(key, [])
            for i in range(1, len(chain)):
                a, b = chain[i - 1], chain[i]
                if a != b and _NO_WRITER not in (a, b):
                    edges = successors[a]
                    edges[b] = edges.get(b, 0) | WW
            last = chain[-1] if chain else _NO_WRITER
            if last != _NO_WRITER:
                for b in late:
                    if b != last:
                        edges = successors[last]
                        edges[b] = edges.get(b, 0) | WW
            size = len(chain)
            for reader, observed in self.readers.get(key, []):
                if observed > 0:
                    a = chain[observed - 1]
                    if a not in (_NO_WRITER, reader):
                        edges = successors[a]
                        edges[reader] = edges.get(reader, 0) | WR
                edges = successors[reader]
                if observed < size:
                    b = chain[observed]
                    if b not in (_NO_WRITER, reader):
                        edges[b] = edges.get(b, 0) | RW
                else:
                    for b in late:
                        if b != reader:
                            edges[b] = edges.get(b, 0) | RW

    def check_timestamps(self, graph: DependencyGraph) -> None:
        """Recorded timestamps must agree with every inferred edge.

        Visibility is ``commit_ts < start_ts`` of the reader, so: ww and wr need
        ``T1.commit_ts < T2.commit_ts``, wr also ``T1.commit_ts < T2.start_ts``, and rw
        (T2 overwrote what T1 read) needs T2 not committed before T1's snapshot.
        """
        txns = self.txns
        for txn in txns:
            if (
                self.committed[txn.id]
                and txn.start_ts is not None
                and txn.commit_ts is not None
                and txn.commit_ts < txn.start_ts
            ):
                self.timestamp_violation(
                    graph,
                    txn,
                    txn,
                    None,
                    f"{txn.describe()} has commit_ts {txn.commit_ts} below "
                    f"its start_ts {txn.start_ts}",
                )
        for source, edges in enumerate(self.successors):
            if not edges:
                continue
            a = txns[source]
            for target, mask in edges.items():
                b = txns[target]
                problem = _edge_timestamp_problem(a, b, mask)
                if problem is not None:
                    self.timestamp_violation(graph, a, b, *problem)

    def timestamp_violation(
        self, graph: DependencyGraph, a: Txn, b: Txn, edge: EdgeName | None, text: str
    ) -> None:
        details: dict[str, object] = {
            "start_ts": [a.start_ts] if a is b else [a.start_ts, b.start_ts],
            "commit_ts": [a.commit_ts] if a is b else [a.commit_ts, b.commit_ts],
        }
        if edge is not None:
            key, why = graph.explain(a.id, b.id, edge)
            details.update(edge=edge, key=key)
            text = f"{text} ({why})"
        self.anomalies.append(
            Anomaly(TIMESTAMP_ORDER, (a,) if a is b else (a, b), text, details=details)
        )


def _edge_timestamp_problem(a: Txn, b: Txn, mask: int) -> tuple[EdgeName, str] | None:
    """Why the timestamps of ``a`` and ``b`` contradict the edges ``mask`` between them."""
    a_commit, b_commit, b_start = a.commit_ts, b.commit_ts, b.start_ts
    if mask & DEPENDENCY and a_commit is not None and b_commit is not None and a_commit >= b_commit:
        edge: EdgeName = "ww" if mask & WW else "wr"
        return edge, (
            f"{a.name} -{edge}-> {b.name} but {a.name}.commit_ts {a_commit} is not "
            f"below {b.name}.commit_ts {b_commit}"
        )
    if mask & WR and a_commit is not None and b_start is not None and a_commit >= b_start:
        return "wr", (
            f"{b.name} read {a.name}'s write, but {a.name}.commit_ts {a_commit} is not "
            f"below {b.name}.start_ts {b_start}"
        )
    a_start = a.start_ts
    if mask & RW and a_start is not None and b_commit is not None and b_commit < a_start:
        return "rw", (
            f"{a.name} did not see {b.name}'s write, yet {b.name}.commit_ts "
            f"{b_commit} is below {a.name}.start_ts {a_start}"
        )
    return None
