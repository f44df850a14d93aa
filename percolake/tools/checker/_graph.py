"""Small graph algorithms over integer vertices: strongly connected components, shortest paths.

Both are iterative (a 100k-transaction history would overflow Python's recursion limit)
and take the graph as a successor function, so callers can restrict a search to one
component and to some edge types without copying the graph.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator

Successors = Callable[[int], Iterable[int]]


def strongly_connected_components(
    vertices: Iterable[int], successors: Successors
) -> list[list[int]]:
    """Tarjan's algorithm; returns the components with more than one vertex.

    ``successors`` must only yield vertices the caller considers part of the graph; a
    vertex reached that is not in ``vertices`` is explored like any other.
    """
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in vertices:
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[int, Iterator[int]]] = [(root, iter(successors(root)))]
        while work:
            vertex, pending = work[-1]
            descended = False
            for successor in pending:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(successors(successor))))
                    descended = True
                    break
                if successor in on_stack and index[successor] < low[vertex]:
                    low[vertex] = index[successor]
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[vertex])
            if low[vertex] == index[vertex]:
                component: list[int] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == vertex:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


class SearchBudget:
    """A shared cap on vertices visited by a series of searches (bounds worst cases)."""

    def __init__(self, visits: int) -> None:
        self.remaining = visits

    @property
    def exhausted(self) -> bool:
        return self.remaining <= 0


def shortest_path(
    start: int, goal: int, successors: Successors, budget: SearchBudget | None = None
) -> list[int] | None:
    """Breadth-first search: the vertices of a shortest path ``start .. goal``, or None.

    Returns None too when ``budget`` runs out before the goal is reached.
    """
    if start == goal:
        return [start]
    parent: dict[int, int] = {start: start}
    frontier: deque[int] = deque([start])
    while frontier:
        vertex = frontier.popleft()
        if budget is not None:
            budget.remaining -= 1
            if budget.remaining < 0:
                return None
        for successor in successors(vertex):
            if successor in parent:
                continue
            parent[successor] = vertex
            if successor == goal:
                path = [goal]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                path.reverse()
                return path
            frontier.append(successor)
    return None
