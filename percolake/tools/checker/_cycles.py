"""Cycle anomalies: G0, G1c, G-single, G-nonadjacent and G2-item.

Every cycle lies inside one strongly connected component of the dependency graph, so the
search starts with Tarjan over the whole graph and then works only inside the
non-trivial components, narrowing the edge types step by step as Elle does:

1. ww+wr components; inside each, ww-only components give G0 cycles, and a wr edge
   inside a ww+wr component closes a G1c cycle;
2. snapshot isolation forbids exactly the cycles of the relation ``(ww|wr) ; rw?``
   (a dependency edge, optionally followed by one anti-dependency; Cerone and Gotsman,
   "Analysing Snapshot Isolation"), i.e. cycles whose rw edges are never adjacent. A
   two-layer graph finds them in linear time: layer 0 leaves a transaction by a
   dependency edge into layer 1, layer 1 returns to layer 0 by an rw edge or in place.
   Its components hold the G-single and G-nonadjacent cycles;
3. any remaining cycle through an rw edge is G2-item (write skew), which only
   serializability forbids.

Valid histories cost linear time: the expensive searches only run inside components
that already prove an anomaly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Final

from percolake.tools.checker._graph import (
    SearchBudget,
    shortest_path,
    strongly_connected_components,
)
from percolake.tools.checker._infer import DEPENDENCY, RW, WR, WW, DependencyGraph, EdgeName
from percolake.tools.checker._report import (
    G0,
    G1C,
    G2_ITEM,
    G_NONADJACENT,
    G_SINGLE,
    Anomaly,
    CycleStep,
)

log = logging.getLogger(__name__)

# Looking for a G-single cycle costs one search per rw edge of a component that already
# holds a forbidden cycle; past this many visited vertices the cycle already found is
# reported instead, so a pathological history cannot stall the check.
_G_SINGLE_SEARCH_VISITS: Final = 2_000_000
# The one-line summary of a cycle names this many steps; the full cycle is in the report.
_STEPS_IN_SUMMARY: Final = 12
# Attempts at a G2-item cycle in a component whose rw edges also close forbidden cycles.
_G2_ATTEMPTS: Final = 16


@dataclass(slots=True)
class CycleSearch:
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)


def find_cycles(graph: DependencyGraph, *, include_g2: bool = True) -> CycleSearch:
    """Find cycle anomalies: one example per anomaly type per component searched."""
    return _Searcher(graph, include_g2).run()


Step = tuple[int, int, EdgeName]


def classify(edges: Iterable[EdgeName]) -> str:
    """Name a cycle by its edge types (Adya's taxonomy, as Elle applies it)."""
    kinds = list(edges)
    anti = kinds.count("rw")
    if anti == 0:
        return G1C if "wr" in kinds else G0
    if anti == 1:
        return G_SINGLE
    adjacent = any(kinds[i] == "rw" and kinds[i - 1] == "rw" for i in range(len(kinds)))
    return G2_ITEM if adjacent else G_NONADJACENT


class _Searcher:
    def __init__(self, graph: DependencyGraph, include_g2: bool) -> None:
        self.graph = graph
        self.successors = graph.successors
        self.include_g2 = include_g2
        self.result = CycleSearch()

    def run(self) -> CycleSearch:
        successors = self.successors
        vertices = [v for v, edges in enumerate(successors) if edges]
        components = strongly_connected_components(vertices, lambda v: successors[v].keys())
        stats = self.result.stats
        stats["sccs"] = len(components)
        stats["largest_scc"] = max((len(c) for c in components), default=0)
        for component in components:
            members = set(component)
            self.dependency_cycles(component, members)
            si_vertices = self.snapshot_isolation_cycles(component, members)
            if self.include_g2:
                self.write_skew_cycle(component, members, si_vertices)
        return self.result

    def restricted(self, mask: int, members: set[int]) -> Callable[[int], list[int]]:
        successors = self.successors

        def step(vertex: int) -> list[int]:
            return [w for w, m in successors[vertex].items() if m & mask and w in members]

        return step

    def dependency_cycles(self, component: list[int], members: set[int]) -> None:
        for dependency_component in strongly_connected_components(
            component, self.restricted(DEPENDENCY, members)
        ):
            inside = set(dependency_component)
            ww_step = self.restricted(WW, inside)
            for ww_component in strongly_connected_components(dependency_component, ww_step):
                ww_members = set(ww_component)
                ww_only = self.restricted(WW, ww_members)
                start = ww_component[0]
                follower = ww_only(start)[0]
                path = shortest_path(follower, start, ww_only)
                assert path is not None  # both lie in one ww component
                self.report([(start, follower, "ww"), *self.label(path, DEPENDENCY)])
            dependency_step = self.restricted(DEPENDENCY, inside)
            wr_edge = next(
                (
                    (a, b)
                    for a in dependency_component
                    for b, mask in self.successors[a].items()
                    if mask & WR and b in inside
                ),
                None,
            )
            if wr_edge is not None:
                a, b = wr_edge
                path = shortest_path(b, a, dependency_step)
                assert path is not None
                self.report([(a, b, "wr"), *self.label(path, DEPENDENCY)])

    def snapshot_isolation_cycles(self, component: list[int], members: set[int]) -> set[int]:
        """Cycles with no two adjacent rw edges; returns the transactions on such cycles."""
        successors = self.successors

        def layered(vertex: int) -> list[int]:
            txn = vertex >> 1
            if vertex & 1 == 0:
                return [
                    (w << 1) | 1
                    for w, m in successors[txn].items()
                    if m & DEPENDENCY and w in members
                ]
            return [txn << 1] + [
                w << 1 for w, m in successors[txn].items() if m & RW and w in members
            ]

        layered_vertices = [v << 1 for v in component]
        on_forbidden_cycles: set[int] = set()
        for layered_component in strongly_connected_components(layered_vertices, layered):
            inside = set(layered_component)
            rw_edges = [
                (vertex >> 1, w)
                for vertex in layered_component
                if vertex & 1
                for w, m in successors[vertex >> 1].items()
                if m & RW and (w << 1) in inside
            ]
            if not rw_edges:
                continue  # only dependency cycles, reported as G0 or G1c
            on_forbidden_cycles.update(vertex >> 1 for vertex in layered_component)

            def within(vertex: int, inside: set[int] = inside) -> list[int]:
                return [w for w in layered(vertex) if w in inside]

            reader, writer = rw_edges[0]
            path = shortest_path(writer << 1, (reader << 1) | 1, within)
            assert path is not None
            steps = self.unlayer(path)
            steps.append((reader, writer, "rw"))
            kind = self.report(steps)
            if kind != G_SINGLE:
                self.single_anti_dependency_cycle(rw_edges, inside)
        return on_forbidden_cycles

    def unlayer(self, path: list[int]) -> list[Step]:
        steps: list[Step] = []
        for vertex, successor in pairwise(path):
            source, target = vertex >> 1, successor >> 1
            if source == target:
                continue  # the in-place return from layer 1 to layer 0
            if vertex & 1:
                steps.append((source, target, "rw"))
            else:
                mask = self.successors[source][target]
                steps.append((source, target, "ww" if mask & WW else "wr"))
        return steps

    def single_anti_dependency_cycle(
        self, rw_edges: list[tuple[int, int]], layered_inside: set[int]
    ) -> None:
        members = {vertex >> 1 for vertex in layered_inside if not vertex & 1}
        dependency_step = self.restricted(DEPENDENCY, members)
        budget = SearchBudget(_G_SINGLE_SEARCH_VISITS)
        for reader, writer in rw_edges:
            path = shortest_path(writer, reader, dependency_step, budget)
            if path is not None:
                self.report([(reader, writer, "rw"), *self.label(path, DEPENDENCY)])
                return
            if budget.exhausted:
                log.warning("G-single search gave up after %d visits", _G_SINGLE_SEARCH_VISITS)
                return

    def write_skew_cycle(
        self, component: list[int], members: set[int], on_forbidden_cycles: set[int]
    ) -> None:
        """One cycle with adjacent rw edges, if the component has one."""
        successors = self.successors
        candidates = [
            (a, b)
            for a in component
            for b, mask in successors[a].items()
            if mask & RW and b in members
        ]
        # Edges off the forbidden cycles come first: through them, every cycle is G2-item.
        candidates.sort(key=lambda e: e[0] in on_forbidden_cycles or e[1] in on_forbidden_cycles)
        any_edge = self.restricted(WW | WR | RW, members)
        for reader, writer in candidates[:_G2_ATTEMPTS]:
            path = shortest_path(writer, reader, any_edge)
            if path is None:
                continue
            steps: list[Step] = [(reader, writer, "rw"), *self.label(path, WW | WR | RW)]
            if classify(edge for _, _, edge in steps) == G2_ITEM:
                self.report(steps)
                return

    def label(self, path: list[int], allowed: int) -> list[Step]:
        """Steps along ``path``, naming each edge by its most benign allowed type."""
        steps: list[Step] = []
        for source, target in pairwise(path):
            mask = self.successors[source][target] & allowed
            edge: EdgeName = "ww" if mask & WW else "wr" if mask & WR else "rw"
            steps.append((source, target, edge))
        return steps

    def report(self, steps: list[Step]) -> str:
        graph = self.graph
        kind = classify(edge for _, _, edge in steps)
        cycle = []
        for source, target, edge in steps:
            key, why = graph.explain(source, target, edge)
            cycle.append(CycleStep(source, target, edge, key, why))
        txns = tuple(graph.txns[source] for source, _, _ in steps)
        shown = [
            f"{graph.txns[step.source].name} -{step.edge}[{step.key!r}]->"
            for step in cycle[:_STEPS_IN_SUMMARY]
        ]
        if len(cycle) > _STEPS_IN_SUMMARY:
            shown.append(f"... ({len(cycle) - _STEPS_IN_SUMMARY} more steps) ->")
        text = f"{kind} cycle of {len(cycle)} transactions: {' '.join(shown)} {txns[0].name}"
        self.result.anomalies.append(Anomaly(kind, txns, text, tuple(cycle)))
        return kind
