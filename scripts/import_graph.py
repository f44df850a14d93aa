"""Count the arrows that run back up in the graph of imports between folders.

    .venv/bin/python scripts/import_graph.py

A folder is a package (or a loose module) at one depth: the top level, or inside
``percolake``, ``spark_integration`` and ``wire``. An arrow from A to B means some
module of A imports some module of B directly (grimp: module-level imports and imports
inside functions alike). Folders are put on floors, each above what it imports, in the
order that leaves the fewest arrows pointing up (exact: dynamic programming over subsets,
fine for the dozen folders of a level); those arrows are printed. The layer contracts in
pyproject.toml keep the count where it is; this script says what it is.
"""

from __future__ import annotations

import grimp

PACKAGES = (
    "wire",
    "storage_adapters",
    "tso",
    "lockserver",
    "txn",
    "spark_integration",
    "percolake",
    "bench",
    "pyspark_percolake",
)

#: (label, package whose folders are compared or None for the top level, depth).
LEVELS = (
    ("top level", None, 1),
    ("inside percolake", "percolake", 2),
    ("inside percolake.serve", "percolake.serve", 3),
    ("inside percolake.tools", "percolake.tools", 3),
    ("inside spark_integration", "spark_integration", 2),
    ("inside wire", "wire", 2),
)


def folder_arrows(graph: grimp.ImportGraph, inside: str | None, depth: int) -> set[tuple[str, str]]:
    arrows: set[tuple[str, str]] = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if inside is not None and not (
                module.startswith(inside + ".") and imported.startswith(inside + ".")
            ):
                continue
            source = ".".join(module.split(".")[:depth])
            target = ".".join(imported.split(".")[:depth])
            if source != target:
                arrows.add((source, target))
    return arrows


def floors(arrows: set[tuple[str, str]]) -> tuple[list[str], list[tuple[str, str]]]:
    """The floor order (bottom first) with the fewest arrows up, and those arrows."""
    nodes = sorted({name for arrow in arrows for name in arrow})
    index = {name: i for i, name in enumerate(nodes)}
    full = (1 << len(nodes)) - 1
    best: list[int | None] = [None] * (full + 1)
    best[0] = 0
    came_from: list[tuple[int, str] | None] = [None] * (full + 1)
    for placed in range(full + 1):
        cost = best[placed]
        if cost is None:
            continue
        for name in nodes:
            bit = 1 << index[name]
            if placed & bit:
                continue
            # Arrows from folders already placed below `name` up to it.
            up = sum(1 for a, b in arrows if b == name and placed & (1 << index[a]))
            after = best[placed | bit]
            if after is None or cost + up < after:
                best[placed | bit] = cost + up
                came_from[placed | bit] = (placed, name)
    order: list[str] = []
    placed = full
    while placed:
        step = came_from[placed]
        assert step is not None
        placed, name = step
        order.append(name)
    order.reverse()
    position = {name: floor for floor, name in enumerate(order)}
    return order, sorted((a, b) for a, b in arrows if position[a] < position[b])


def main() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    for label, inside, depth in LEVELS:
        arrows = folder_arrows(graph, inside, depth)
        if not arrows:
            continue
        order, up = floors(arrows)
        print(f"{label}: {len(arrows)} arrows between {len(order)} folders, {len(up)} up {up}")
        print(f"    floors, bottom first: {' < '.join(order)}")


if __name__ == "__main__":
    main()
