"""A lakehouse group commit on Cassandra against its physical floor, same cluster, same run.

A group commit of G appends (``Catalog.commit_group``, what ``percolake serve`` runs
for appends that arrive together) reads the table's head row and the requests' job
marks, writes each request's file rows, log record and mark and the new head, and
reaches its commit point with one lightweight transaction. With the raw driver the
least that can cost is one read round, one write round and one LWT (issue 27), so:

* floor: the same partitions read concurrently from a plain table (``execute_async``,
  all at once), the same number of rows written concurrently, one
  ``INSERT ... IF NOT EXISTS``; timed back to back with the group commits;
* ``lakehouse.appends.cassandraN.group_commit.vs_floor.ratio``: floor time / group
  commit time, per paired run (N: the cluster's node count; goal >= 0.6 on 3 nodes).

The commit's own steps (``percolake_commit_step_seconds``, txn/_committer.py) over the
timed commits go in the figure's note, so the figure says where the rest went. The
group's follow-up work (checkpoints, commit stamps) runs off the clock after each
pair, as the gateway runs it later, on another thread.

Run it on a running cluster with ``--url`` (``percolake cassandra start --nodes 3
--dir D`` starts three nodes); without one it starts a one-node Cassandra.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench._results import Result, summarize
from storage_adapters import open_store
from storage_adapters.cassandra import CassandraStore

log = logging.getLogger(__name__)

FLOOR_ANCHOR = (
    "floor: 1 read round + 1 write round + 1 LWT with the raw driver (the same "
    "partitions read, as many rows written), same cluster, same run"
)
#: Appends a group commits together (what 8 writers sending at once make).
GROUP = 8


def node_count(store: CassandraStore) -> int:
    """Nodes of the store's cluster, as the driver's metadata lists them."""
    return len(store._cluster.metadata.all_hosts())


def figure_name(store: CassandraStore) -> str:
    """The prefix of a store-level figure: ``cassandra`` on one node (the names the
    results have always had), ``cassandraN`` on a cluster of N."""
    nodes = node_count(store)
    return "cassandra" if nodes == 1 else f"cassandra{nodes}"


class RawFloor:
    """The floor of one group commit with the raw driver, on plain tables."""

    def __init__(self, store: CassandraStore) -> None:
        self.session: Any = store._session
        ks = '"' + store.settings.keyspace + '"'
        for ddl in (
            f"CREATE TABLE IF NOT EXISTS {ks}.floor_rows (k blob PRIMARY KEY, value blob)",
            f"CREATE TABLE IF NOT EXISTS {ks}.floor_lwt (k blob PRIMARY KEY, value blob)",
        ):
            self.session.execute(ddl, timeout=60)
        self.read = self.session.prepare(f"SELECT value FROM {ks}.floor_rows WHERE k = ?")
        self.write = self.session.prepare(f"INSERT INTO {ks}.floor_rows (k, value) VALUES (?, ?)")
        self.lwt = self.session.prepare(
            f"INSERT INTO {ks}.floor_lwt (k, value) VALUES (?, ?) IF NOT EXISTS"
        )
        self.lwt.is_idempotent = False

    def _round(self, statement: Any, params: list[tuple[Any, ...]]) -> None:
        futures = [self.session.execute_async(statement, p) for p in params]
        for future in futures:
            future.result()

    def once(
        self, reads: int, writes: int, value: bytes, serial: Iterator[int]
    ) -> dict[str, float]:
        """One floor: milliseconds of each round and their sum."""
        n = next(serial)
        keys = [f"f{n}-{i}".encode() for i in range(max(reads, writes))]
        out: dict[str, float] = {}
        began = time.perf_counter()
        self._round(self.read, [(k,) for k in keys[:reads]])
        out["read"] = (time.perf_counter() - began) * 1000
        began = time.perf_counter()
        self._round(self.write, [(k, value) for k in keys[:writes]])
        out["write"] = (time.perf_counter() - began) * 1000
        began = time.perf_counter()
        # The store's "lwt" profile: QUORUM commit, SERIAL Paxos, as its commit point.
        self.session.execute(self.lwt, (f"t{n}".encode(), b"c"), execution_profile="lwt")
        out["lwt"] = (time.perf_counter() - began) * 1000
        out["floor"] = out["read"] + out["write"] + out["lwt"]
        return out


def _step_sums() -> dict[str, float]:
    from wire import metrics

    sums: dict[str, float] = {}
    for family in metrics.COMMIT_STEP_SECONDS.collect():
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                sums[sample.labels["step"]] = sample.value
    return sums


def _run_follow_ups(deferred: list[Callable[[], None]]) -> None:
    while deferred:
        deferred.pop(0)()


def group_commit_figures(
    url: str,
    quick: bool,
    progress: Callable[[str], None] = lambda _: None,
    *,
    runs: int | None = None,
) -> list[Result]:
    """Group commits of ``GROUP`` appends against the floor, in ``runs`` paired runs
    (default 5; 3 quick)."""
    from spark_integration.engine import Catalog, CommitRequest
    from spark_integration.engine.model import APPEND, FileEntry, TableMeta
    from txn import TransactionManager

    commits = 10 if quick else 40
    runs = runs or (3 if quick else 5)
    store = open_store(url)
    assert isinstance(store, CassandraStore)
    nodes = node_count(store)
    prefix = f"lakehouse.appends.cassandra{nodes}.group_commit"
    floor = RawFloor(store)
    tm = TransactionManager.embedded(url)
    deferred: list[Callable[[], None]] = []
    catalog = Catalog(tm, "bench", follow_ups=deferred.append, commit_ts_of=tm.outcome_of)
    table = f"t{time.time_ns()}"
    catalog.create(TableMeta(table, "{}", (), f"/bench/{table}", 0), job_id=f"create-{table}")
    jobs = itertools.count()
    serial = itertools.count()

    def group() -> list[CommitRequest]:
        now_ms = int(time.time() * 1000)
        out = []
        for _ in range(GROUP):
            job = f"job-{next(jobs)}"
            files = (FileEntry(f"_lh_job={job}/part-0.parquet", 4096, 100),)
            out.append(CommitRequest(APPEND, files, job, now_ms))
        return out

    # What one group reads (head + a job mark each) and writes (per append: a file
    # row, a log record, a job mark; and the head).
    reads, writes = 1 + GROUP, 3 * GROUP + 1
    value = b"x" * 200
    group_ms: list[float] = []
    floor_ms: dict[str, list[float]] = {"read": [], "write": [], "lwt": [], "floor": []}
    ratios: list[float] = []
    try:
        for _ in range(3):  # warm: prepared statements, connections, caches
            catalog.commit_group(table, group())
            floor.once(reads, writes, value, serial)
            _run_follow_ups(deferred)
        steps: dict[str, float] = {}
        for run in range(runs):
            progress(f"{prefix}: run {run + 1}/{runs}")
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(commits):  # alternate, so both see the same load
                requests = group()
                before = _step_sums()
                began = time.perf_counter()
                results = catalog.commit_group(table, requests)
                ours.append((time.perf_counter() - began) * 1000)
                for step, total in _step_sums().items():
                    steps[step] = steps.get(step, 0.0) + total - before.get(step, 0.0)
                if len(results) != GROUP or any(isinstance(r, Exception) for r in results):
                    raise AssertionError(f"a group commit failed: {results}")
                one = floor.once(reads, writes, value, serial)
                theirs.append(one["floor"])
                for key, ms in one.items():
                    floor_ms[key].append(ms)
                _run_follow_ups(deferred)  # off the clock, as the gateway runs them later
            group_ms.extend(ours)
            ratios.append(statistics.median(theirs) / statistics.median(ours))
    finally:
        tm.close()
        store.close()
    timed = runs * commits
    steps_note = ", ".join(
        f"{step} {total / timed * 1000:.1f} ms"
        for step, total in steps.items()
        if total / timed >= 0.00005
    )
    what = (
        f"{nodes} node(s); groups of {GROUP} appends (Catalog.commit_group, one client "
        f"thread), {runs} paired runs of {commits} commits each alternating with the floor"
    )
    return [
        summarize(
            f"{prefix}.vs_floor.ratio",
            "ratio",
            FLOOR_ANCHOR,
            ratios,
            note=f"median floor ms / median group-commit ms per paired run; {what}; "
            f"the transaction's steps per commit: {steps_note}",
        ),
        summarize(f"{prefix}.ms", "ms", FLOOR_ANCHOR, group_ms, note=what),
        summarize(
            f"{prefix}.floor.ms",
            "ms",
            "none: the floor itself",
            floor_ms["floor"],
            note=f"{reads} partitions read concurrently "
            f"(median {statistics.median(floor_ms['read']):.1f} ms), {writes} rows written "
            f"concurrently ({statistics.median(floor_ms['write']):.1f} ms), one INSERT IF NOT "
            f"EXISTS ({statistics.median(floor_ms['lwt']):.1f} ms); raw driver, QUORUM/SERIAL",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_cassandra_floor", description=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    parser.add_argument("--url", help="cassandra:// URL of a running cluster (default: start one)")
    parser.add_argument(
        "--write", action="store_true", help="merge the figures into bench/results/latest.json"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from bench.__main__ import print_result
    from bench.bench_cassandra import cassandra_url

    def progress(step: str) -> None:
        print(f"   {step} ...", flush=True)

    with cassandra_url(args.url) as store_url:
        results: list[Result] = list(group_commit_figures(store_url, args.quick, progress))
    for result in results:
        print_result(result)
    if args.write:
        from bench._results import write_for_command

        print(f"written to {write_for_command(results, quick=args.quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
