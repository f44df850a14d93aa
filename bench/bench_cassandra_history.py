"""Cassandra reads after clean-up and on long histories (issue 18 items 1 and 2).

Topology: one Cassandra 5.0 node started for the run (default ``cassandra.yaml`` of the
launcher: ``tombstone_failure_threshold`` 100,000), driven in-process through the
``KVStore`` API (``open_store``), one client thread.

* **Tombstones** (``cassandra.tombstones.*``): a table of 1,000 live cells and
  1,000,000 cleaned versions (20,000 with ``--quick``): aborted writers' versions on
  cells of their own, every one removed with ``delete_versions``, as the cleaner does.
  The keyspace has 8 shards, so each shard holds 125,000 cleaned cells, past the
  threshold, as 3.2 million would with the default 32 (the issue's failing case).
  Measured: a full scan, the first 100 entries of a scan, and ``get_latest`` of 100
  cells (half live, half cleaned); runs that failed are counted, not timed.
* **Long history** (``cassandra.long_history.*``): one cell with 100,000 versions
  (5,000 with ``--quick``), as a lakehouse head row gains one per commit, next to 10
  cells of one version: five more columns of its row, five other rows. Measured:
  ``get_latest`` of that cell alone, of all 11 cells, and a scan of the table.

The figures of the format-1 layout (one ``versions`` table read with ``GROUP BY``)
were measured with this file on commit 3db83de, same machine, and are kept in
:data:`BEFORE`; each "after" figure names its "before" in its anchor. To measure a
layout again, run this module from a checkout of that commit::

    git worktree add /tmp/old18 3db83de && cp bench/bench_cassandra_history.py /tmp/old18/bench/
    cd /tmp/old18 && PYTHONPATH=/tmp/old18 .venv-path/bin/python -m bench.bench_cassandra_history
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from bench._results import Figure, Result, summarize
from storage_adapters import MAX_TIMESTAMP, KVStore, StoreError, VersionWrite, open_store

log = logging.getLogger(__name__)

VALUE = b"x" * 64
LIVE_CELLS = 1_000
SHARDS = 8
CHUNK = 20_000
HISTORY_OTHERS = 10
TOPOLOGY = "one Cassandra 5.0 node, default thresholds, KVStore API in-process, one client"

#: Format-1 figures (commit 3db83de), measured with this file in full mode on this
#: machine, 2026-11-23: name -> (value, unit, runs, note).
_OLD = "format 1, commit 3db83de, this bench in full mode, 2026-11-23; " + TOPOLOGY
BEFORE: dict[str, tuple[float, str, int, str]] = {
    "cassandra.long_history.versions100000.get_latest_one.ms": (1.998, "ms", 20, _OLD),
    "cassandra.long_history.versions100000.get_latest11.ms": (266.788, "ms", 20, _OLD),
    "cassandra.long_history.versions100000.scan.ms": (274.143, "ms", 20, _OLD),
    "cassandra.tombstones.cleaned1000000.write_and_clean.versions_per_s": (
        1875.3,
        "versions/s",
        1,
        _OLD,
    ),
    "cassandra.tombstones.cleaned1000000.scan.failed_runs": (
        5.0,
        "runs",
        5,
        "every full scan raised StoreUnavailableError (READ_TOO_MANY_TOMBSTONES); " + _OLD,
    ),
    "cassandra.tombstones.cleaned1000000.scan_first100.ms": (173.925, "ms", 5, _OLD),
    "cassandra.tombstones.cleaned1000000.get_latest100.ms": (31.071, "ms", 5, _OLD),
}


def _layout() -> str:
    from storage_adapters import cassandra

    return "format2" if hasattr(cassandra, "cell_key") else "format1"


def _url(base: str, keyspace: str, **options: object) -> str:
    parts = urlsplit(base)
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return urlunsplit((parts.scheme, parts.netloc, f"/{keyspace}", query, ""))


def _timed_ms(runs: int, once: Callable[[], object]) -> tuple[list[float], int]:
    """Milliseconds of each run that succeeded, and how many failed (a store error)."""
    samples: list[float] = []
    failed = 0
    for _ in range(runs):
        started = time.perf_counter()
        try:
            once()
        except StoreError as exc:
            log.warning("run failed: %s", exc)
            failed += 1
            continue
        samples.append((time.perf_counter() - started) * 1000)
    return samples, failed


def _figures(
    prefix: str, name: str, samples: list[float], failed: int, runs: int, what: str
) -> list[Figure]:
    full = f"{prefix}.{name}"
    out = [
        Figure(
            f"{full}.failed_runs",
            float(failed),
            "runs",
            runs,
            0.0,
            "the memory store answers every run",
            note=f"{what}; runs that raised a store error, of {runs}; {TOPOLOGY}",
        )
    ]
    if samples:
        anchor = (
            f"format-1 layout (GROUP BY, commit 3db83de): "
            f"{full.replace('cassandra.', 'cassandra.format1.', 1)}.ms / .failed_runs"
        )
        out.append(summarize(f"{full}.ms", "ms", anchor, samples, f"{what}; {TOPOLOGY}"))
    return out


def tombstone_figures(url: str, quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    cleaned = 20_000 if quick else 1_000_000
    runs = 3 if quick else 5
    prefix = f"cassandra.tombstones.cleaned{cleaned}"
    store = open_store(_url(url, f"bench_tombstones_{cleaned}", shards=SHARDS))
    try:
        live = [(f"k{i * (cleaned // LIVE_CELLS):09d}".encode(), b"c") for i in range(LIVE_CELLS)]
        store.put_versions("t", [VersionWrite(r, c, 1, VALUE) for r, c in live])
        progress(f"{prefix}: writing and cleaning")
        started = time.monotonic()
        for first in range(0, cleaned, CHUNK):
            doomed = [
                (f"k{i:09d}x".encode(), b"c", 10) for i in range(first, min(cleaned, first + CHUNK))
            ]
            store.put_versions("t", [VersionWrite(r, c, ts, VALUE) for r, c, ts in doomed])
            store.delete_versions("t", doomed)
        load_s = time.monotonic() - started
        figures = [
            Figure(
                f"{prefix}.write_and_clean.versions_per_s",
                round(cleaned / load_s, 1),
                "versions/s",
                1,
                0.0,
                "put_versions then delete_versions, 20,000 versions a call",
                note=TOPOLOGY,
            )
        ]
        progress(f"{prefix}: reads")

        def full_scan() -> None:
            got = sum(1 for _ in store.scan("t", b"", None, MAX_TIMESTAMP, page_size=1000))
            assert got == LIVE_CELLS, got

        def first_page() -> None:
            entries = store.scan("t", b"", None, MAX_TIMESTAMP, page_size=100)
            got = [e for _, e in zip(range(100), entries, strict=False)]
            assert len(got) == 100, len(got)

        half = [(r + b"x", c) for r, c in live[:50]]
        cells = live[:50] + half

        def get_latest() -> None:
            assert len(store.get_latest("t", cells, MAX_TIMESTAMP)) == 50

        for name, once, what in (
            ("scan", full_scan, f"full scan: {LIVE_CELLS:,} live cells among {cleaned:,} cleaned"),
            ("scan_first100", first_page, "the first 100 entries of a scan (page_size 100)"),
            ("get_latest100", get_latest, "get_latest of 100 cells, 50 live, 50 cleaned"),
        ):
            samples, failed = _timed_ms(runs, once)
            figures += _figures(prefix, name, samples, failed, runs, what)
    finally:
        store.close()
    return figures


def history_figures(url: str, quick: bool, progress: Callable[[str], None]) -> list[Figure]:
    history = 5_000 if quick else 100_000
    runs = 5 if quick else 20
    prefix = f"cassandra.long_history.versions{history}"
    store: KVStore = open_store(_url(url, f"bench_history_{history}"))
    try:
        progress(f"{prefix}: writing")
        hot = (b"head", b"log")
        for first in range(1, history + 1, CHUNK):
            store.put_versions(
                "t",
                [
                    VersionWrite(*hot, ts, VALUE)
                    for ts in range(first, min(history + 1, first + CHUNK))
                ],
            )
        # Five more columns of the hot cell's row (one shard, as a table's head row
        # and its neighbours) and five other rows.
        others = [(b"head", f"col{i}".encode()) for i in range(HISTORY_OTHERS // 2)]
        others += [(f"row{i:03d}".encode(), b"log") for i in range(HISTORY_OTHERS // 2)]
        store.put_versions("t", [VersionWrite(r, c, 1, VALUE) for r, c in others])
        progress(f"{prefix}: reads")

        def one() -> None:
            assert store.get_latest("t", [hot], MAX_TIMESTAMP)

        def many() -> None:
            assert len(store.get_latest("t", [hot, *others], MAX_TIMESTAMP)) == 11

        def scan() -> None:
            assert sum(1 for _ in store.scan("t", b"", None, MAX_TIMESTAMP)) == 11

        figures: list[Figure] = []
        for name, once, what in (
            ("get_latest_one", one, f"get_latest of the cell of {history:,} versions alone"),
            ("get_latest11", many, "get_latest of that cell, 5 columns of its row, 5 rows"),
            ("scan", scan, "scan of the table: that cell and 10 cells of one version"),
        ):
            samples, failed = _timed_ms(runs, once)
            figures += _figures(prefix, name, samples, failed, runs, what)
    finally:
        store.close()
    return figures


def before_figures() -> list[Figure]:
    """The format-1 layout's figures as measured (see :data:`BEFORE`), renamed
    ``cassandra.format1.*`` so they stand next to today's in the results."""
    return [
        Figure(
            name.replace("cassandra.", "cassandra.format1.", 1),
            value,
            unit,
            runs,
            0.0,
            "recorded: format-1 layout (GROUP BY), commit 3db83de, this bench, same machine",
            note=note,
        )
        for name, (value, unit, runs, note) in sorted(BEFORE.items())
    ]


def run(
    quick: bool,
    progress: Callable[[str], None] = lambda _: None,
    url: str | None = None,
    *,
    history_only: bool = False,
) -> list[Result]:
    """Starts its own node without ``url`` (see ``bench.bench_cassandra.cassandra_url``)."""
    from bench.bench_cassandra import cassandra_url

    with cassandra_url(url) as store_url:
        results: list[Result] = []
        results += history_figures(store_url, quick, progress)
        if not history_only:
            results += tombstone_figures(store_url, quick, progress)
    if _layout() == "format2":
        results += before_figures()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_cassandra_history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="20k cleaned, 5k versions")
    parser.add_argument("--url", help="cassandra:// URL of a running cluster (default: start one)")
    parser.add_argument(
        "--write", action="store_true", help="merge the figures into bench/results/latest.json"
    )
    parser.add_argument("--history-only", action="store_true", help="only the long-history figures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from bench.__main__ import print_result

    print(f"   layout {_layout()}", flush=True)
    results = run(
        args.quick,
        progress=lambda n: print(f"   {n} ...", flush=True),
        url=args.url,
        history_only=args.history_only,
    )
    for result in results:
        print_result(result)
    if args.write:
        from bench._results import write_for_command

        print(f"wrote {write_for_command(results, quick=args.quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
