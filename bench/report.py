"""Render the benchmark results: docs/benchmarks.md, the README's summary, the PNG plots.

Both Markdown outputs are generated from ``bench/results/latest.json`` (and
``latest-series.json``), so neither can drift from the results (a test checks both):

- ``docs/benchmarks.md``, the whole report: how the run works, every ratio against
  its anchor, links to the plots, every figure;
- the README's summary, between two markers: the stable figures (``CONTRACT_FIGURES``),
  and a link to the report.

``python -m bench.report`` rewrites both from the committed results without running
a benchmark (``--plots`` redraws the plots too). The plots are drawn from
``latest.json`` and ``latest-series.json``:

- ``plot_ratios.png``: every ``*.ratio`` figure against its anchor, 1.0 marked;
- ``plot_growth_<name>.png``: how a cost grows with the work (cells per transaction,
  commits per table, concurrent writers, history length);
- ``plot_latency_<name>.png``: latency distributions as CDFs with a log x axis.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "bench" / "results" / "latest.json"
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"

#: The plots' folder as a link from docs/benchmarks.md, which sits one level down.
PLOTS_LINK = Path(os.path.relpath(RESULTS.parent, BENCHMARKS.parent)).as_posix()
#: docs/benchmarks.md as a link from the README.
BENCHMARKS_LINK = BENCHMARKS.relative_to(ROOT).as_posix()

#: The stable figures, the ones the project contract names, in the README's order,
#: each with what the README says it compares and which way is better.
CONTRACT_FIGURES: dict[str, str] = {
    "cassandra.txn_vs_raw.cells100.ratio": (
        "100-cell transactions / raw prepared inserts of the same cells, one Cassandra "
        "node, cells/s (Percolator reported 0.23 of Bigtable)"
    ),
    "tso.grpc.clients64.ts_per_s": (
        "timestamps/s through gRPC, 64 concurrent callers in one client process "
        "(Percolator reported about 2M/s)"
    ),
    "lakehouse.appends.writers8.vs_deltalake.ratio": (
        "one-file appends/s, 8 writer processes, percolake through `percolake serve` on "
        "SQLite / delta-rs"
    ),
    "lakehouse.appends.writers8.vs_writers1.ratio": (
        "percolake appends/s with 8 writer processes / with 1, gateway on SQLite"
    ),
    "lakehouse.appends.cassandra.writers8.vs_deltalake.ratio": (
        "as the first, the gateway on a 3-node Cassandra, replication factor 3"
    ),
    "lakehouse.appends.cassandra3.writers8.vs_deltalake.ratio": (
        "the same runs, third wave's name (goal 5x, 0 failed commits)"
    ),
    "lakehouse.appends.cassandra3.writers8.vs_writers1.ratio": (
        "appends/s with 8 writer processes / with 1, 3-node Cassandra (goal 2)"
    ),
    "lakehouse.appends.cassandra3.group_commit.vs_floor.ratio": (
        "group commit of 8 appends, 3-node Cassandra: floor time (1 read round + 1 write "
        "round + 1 LWT, raw driver, same run) / group-commit time (goal 0.6)"
    ),
    "cassandra3.txn_vs_raw.cells100.ratio": (
        "as the first figure, 3-node Cassandra RF 3 (goal 0.90)"
    ),
    "cassandra.scan.after_dead_cells100000.vs_live_only.ratio": (
        "scan of 2 live cells among 100,000 cleaned ones 2 min after the index prune "
        "(right after it: 5.0) / the same scan of a fresh table, 3-node Cassandra (goal 2)"
    ),
    "cassandra.gc.cell_versions25000.pass.seconds": (
        "one garbage-collection pass over a cell of 25,000 committed versions and their "
        "transactions-table entries, 3-node Cassandra RF 3, the collector in the bench "
        "process (goal: seconds; 549 s at issue 27)"
    ),
    "lakehouse.s3.appends.writers8.vs_deltalake.ratio": (
        "as the third, the table on MinIO: percolake / delta-rs with "
        "`conditional_put=etag` (goal 10x, 0 failed commits)"
    ),
    "lakehouse.s3.appends.writers8.commits_per_s": (
        "one-file appends/s, 8 writer processes, `percolake serve` on SQLite, table on MinIO"
    ),
    "spark.datasource.s3.write.vs_parquet.ratio": (
        '~1 GB written by `format("percolake")` to `s3://` on MinIO / by '
        "`df.write.parquet` to `s3a://` (lower is better; goal 1.10)"
    ),
    "lakehouse.list_files.commits100000.vs_deltalake.ratio": (
        "listing live files from a cold start after 100,000 commits, delta-rs time / ours"
    ),
    "spark.commit_hook.overhead.ratio": (
        "`lh.append(df)` time / plain `df.write.parquet` of the same DataFrame"
    ),
    "ha.leader_kill.outage_s": (
        "kill -9 of the leading replica until every writer commits again, 3 replicas on "
        "SQLite, 2 s lease, 4 writers (goal under 5 s)"
    ),
    "ha.leader_pause.outage_s": ("the same for a 6 s SIGSTOP of the leader (goal under 5 s)"),
    "serve.restart_after_kill.first_commit_s": (
        "restart of `percolake serve` on SQLite after kill -9 until the first commit (goal 1 s)"
    ),
    "serve.cold_start.first_commit_s": (
        "start of `percolake serve` on a new SQLite store until the first commit (goal 1 s)"
    ),
    "txn.hotkeys.pessimistic.clients64.vs_clients1.ratio": (
        "increments of 4 hot counters, `tm.run(fn, pessimistic=True)` through `percolake "
        "serve` on SQLite, commits/s 64 clients / 1 (goal 0.8)"
    ),
    "txn.hotkeys.pessimistic.cassandra3.clients8.vs_clients1.ratio": (
        "the same on 3-node Cassandra RF 3, 8 clients / 1 (goal 0.8)"
    ),
    "txn.hotkeys.optimistic.clients64.failed": (
        "optimistic `tm.run(fn)`, 64 clients: transactions out of retries (goal 0)"
    ),
    "gc.store_rows.with_vs_without.ratio": (
        "store rows after up to 1,000,000 commits to 4 hot cells through `percolake serve` "
        "on SQLite, GC every 2 s / without (lower is better)"
    ),
}

#: Ratios where below 1 is percolake ahead: overheads, and what is left with a cost cut.
_LOWER_IS_BETTER = ("overhead", "gc.store_rows.")

_GENERATED = (
    "<!-- Generated by bench/report.py from bench/results/latest.json and "
    "latest-series.json: do not edit.\n"
    "     Regenerate with `make bench` (a full run), or from the committed results "
    "with `.venv/bin/python -m bench.report`. -->"
)

#: What each suite puts side by side: (comparison, percolake, anchor).
_COMPARISONS = (
    (
        "Cassandra writes",
        "1 to 1,000-cell transactions",
        "prepared inserts, and unlogged batches, of the same cells on the same node",
    ),
    (
        "concurrent appends, deployed",
        "`append_files`, 1 to 16 writer processes through `percolake serve` on SQLite and "
        "Cassandra (1 node; 3 nodes, replication factor 3)",
        "`deltalake` and `pyiceberg` writer processes, same appends",
    ),
    (
        "concurrent appends on S3",
        "`append_files` to an `s3://` table on MinIO, 8 writer processes through "
        "`percolake serve` on SQLite, S3 requests per commit counted by MinIO",
        "`deltalake` (`conditional_put=etag`) and `pyiceberg` (SQL catalog on SQLite) "
        "writer processes, same MinIO",
    ),
    (
        "concurrent appends, in process",
        "`append_files`, 1 to 8 threads, embedded manager",
        "`deltalake` (delta-rs) and `pyiceberg` (SQL catalog on SQLite)",
    ),
    ("listing a table's files", "after 10 to 100,000 commits", "the same libraries, cold start"),
    (
        "failover",
        "kill -9 or a 6 s SIGSTOP of the leading one of 3 `percolake serve` replicas "
        "(default 2 s lease) while 4 writer processes commit, on SQLite and a 3-node "
        "Cassandra: seconds until every writer commits again",
        "the goal of under 5 s; the lease's own wait (lease x 1.1 after the last renewal)",
    ),
    (
        "restarts",
        "start of the only `percolake serve` on SQLite (new store; after kill -9; after "
        "SIGTERM) until a client's first commit",
        "the goal of 1 s or less; before the fix, a restart after kill -9 waited out the "
        "dead leader's lease",
    ),
    (
        "garbage collection",
        "store rows and bytes after 10,000 to 1,000,000 commits through `percolake serve` "
        "with `--gc-interval-s 2`; a long-history cell's latency after a pass",
        "the same commits without collection; the same cell before the pass",
    ),
    ("snapshot reads", "latest and old versions, cold", "the same libraries"),
    (
        "Spark end-to-end writes",
        "`lh.append(df)`",
        "`df.write.parquet`, plus one delta-rs or pyiceberg commit of those files",
    ),
    (
        "MERGE, deployed",
        "`lh.merge(...).when_matched_update_all().when_not_matched_insert_all()` of 1% of "
        "a 10M-row, 100-file table (half updates, half inserts) through `percolake serve` "
        "on SQLite; two writer processes each running 50 MERGEs into their own partition "
        "at once: failed statements",
        "`deltalake` `DeltaTable.merge` of the same rows and source; the same two-process "
        "workload with delta-rs (default conflict handling, no retries)",
    ),
    (
        "Spark writes to S3",
        '`df.write.format("percolake")` of 10M rows (~1 GB) to an `s3://` table on MinIO',
        "`df.write.parquet` of the same DataFrame to `s3a://` on the same bucket",
    ),
    (
        "timestamp oracle",
        "gRPC, 1 to 64 threads or coroutines",
        "Percolator's published 2M timestamps/s",
    ),
    (
        "Cassandra ordered scans",
        "1,000,000 rows in key order",
        "a plain token-order (unordered) SELECT of the same rows",
    ),
    (
        "lock server",
        "lock/unlock pairs through gRPC",
        "AtlasDB's 1 + 3 synchronous lock/timestamp calls per write transaction",
    ),
    (
        "history checker",
        "list-append histories of up to 100,000 transactions",
        "Elle (VLDB 2020), near-linear in history length",
    ),
)

#: How the run works: the part of the report that does not come from the results.
_INTRO = """\
# Benchmarks

`make bench` (or `percolake bench` from a checkout) runs every benchmark in one process
tree with a progress bar, about 30 minutes on two cores plus three to four hours of
garbage-collection curves (`bench.bench_gc`, a million commits with and without
collection; `--only` any other suite to skip it). It starts its own Cassandra
nodes from the cached Maven Central jars (one node, and a three-node cluster), `percolake
serve` processes, writer processes and a local[2] Spark session, and runs every anchor on
the same machine in the same run:

{comparisons}

It writes `bench/results/latest.json`, with a dated copy: the machine, the package
versions, and every figure with its name, value, unit, runs, spread, anchor and note.
`latest-series.json` holds the growth curves and latency distributions. It draws the
PNG plots next to those files and regenerates this page and the README's summary from
the results file; `tests/unit/test_bench_report.py` fails when they disagree.

`make bench-quick` (`python -m bench --quick`, about four minutes) runs everything with
short runs and writes under `bench/results/quick/`, never over the full results and
never to this page or the README; `make test` runs it once end to end.
`--only bench.bench_lakehouse` reruns one suite and merges its figures into the results
file. Every figure is a median; spread is (max - min) / median over its runs, and its
note in the results file gives the sizes and which way round a ratio is. Ratios pair
runs made back to back, so machine noise hits both sides of a comparison alike.

The lakehouse append figures named in the contract are measured as users deploy
percolake (`bench.bench_lakehouse_deployed`): each writer a process of its own with a
remote manager, through `percolake serve`; quick mode runs it on SQLite only. To see
where a gateway's time goes, run that suite with `PERCOLAKE_BENCH_PROFILE=cprofile`
(or `py-spy`, when it is installed): each gateway is profiled and a summary with the
RPCs served per commit is written to `.percolake/bench-profiles/`.

Tables on S3 (`bench.bench_lakehouse_s3`) are measured against a real MinIO that the
suite starts on 127.0.0.1 in a temporary folder, on the same machine as everything else.
Appends: 8 writer processes (the deployed suite's pool) append one-file commits to one
new table for a fixed time, each system in turn, order rotated per run. percolake's
writers go through one `percolake serve` on SQLite and place each commit's 10-row
Parquet object with one server-side CopyObject; delta-rs writers commit one `AddAction`
(no data object) with the storage option `conditional_put=etag`, its safe setting for
concurrent writers on S3 (commit files written with `If-None-Match`; the suite first
checks that a stale handle's commit lands at the next version instead of overwriting);
pyiceberg writers use a SQL catalog on SQLite with the warehouse on the same bucket and
`add_files` (pyiceberg's own retries, then a reload and retry, up to 20 times). After
every run the table is read back and must hold exactly the committed files. S3 requests
per commit are MinIO's own count (`minio_api_requests_total` of its v3 metrics, made
readable with `MINIO_PROMETHEUS_AUTH_TYPE=public`) over the run, divided by the
successful commits. The Spark write puts one DataFrame (10 million rows, five columns,
one a 64-character hash; quick mode 200,000) through `format("percolake")` into an
`s3://` table and through `df.write.parquet` into `s3a://` on the same bucket (the s3a
settings of `spark_integration.spark.session.s3a_conf`, Hadoop's default
FileOutputCommitter, whose rename is a copy and a delete on S3), paired runs after a
warm-up of each.

The three-node Cassandra figures of issue 27 run on one cluster of three nodes on
127.0.0.x, replication factor 3, on this same two-core machine (three JVMs beside the
gateway, the writers and the anchors): `python -m bench.bench_cassandra --url URL
--only-commit --write` (writes against raw inserts, `cassandra3.*`, and the group commit
against its floor, `lakehouse.appends.cassandra3.group_commit.*`, with the commit's
steps in the figure's note) and `python -m bench.bench_lakehouse_deployed --store
cassandra --writers 1 --writers 8 --url URL --write` (without `--url` each starts its
own cluster). Each ratio pairs runs made back to back in the same run; the absolute
figures move with the machine's load, which the commit message of each result records.
The deployed suite measures a Cassandra store warm, as servers run in production: first
its writers load it in rounds of 10-second runs, one per writer count of the phase, at
least three rounds, until the rate stops climbing while the nodes' JIT compiler threads
take at most 5% of their CPU over a round (or for 600 s, `--warmup-s`; the figures'
notes say how far it got). A node compiles for minutes after it starts, again after it
idled, and again when the load changes (a warm-up with 8 writers only left the measured
runs, which alternate 1 and 8, compiling): on a fresh cluster the compiler took two
thirds of the nodes' CPU in the first runs and still a tenth after five minutes. What is left of
it in the measured runs is `...writersN.cpu_ms_per_commit.store_jit`.
CPU per commit counts from the writers' release, once their handles are open, to the
end of the run.

MERGE (`bench.bench_lakehouse_merge`; reproduce with `.venv/bin/python -m bench --only
bench.bench_lakehouse_merge`, `--quick` for 200,000 rows in 10 files and 5 MERGEs per
writer) runs on the same machine with one `percolake serve` on SQLite, local disk, the
Lakehouse over a remote manager. `lakehouse.merge.rows10m.vs_deltalake.ratio` is
delta-rs's MERGE time over ours (above 1: we are faster) on an unpartitioned table of 10
million rows in 100 files, the delta-rs table holding the very same rows: each MERGE's
source is 1% of the rows, half updates of existing keys spread over every file, half
new keys, `ON target.id = source.id`, update all and insert all; paired runs after a
warm-up of each, order rotated. `lakehouse.merge.concurrent_disjoint.failed` counts our
failed statements when two writer processes (each its own local[1] Spark session) run
50 MERGEs each into their own partition of one table at once, no retries; delta-rs's
count for the same two-process workload (its default conflict handling) is
`lakehouse.merge.concurrent_disjoint.deltalake_failed` and in the anchor. delta-spark is
no anchor: its newest build on Maven Central (4.4.0) is for Spark 4.2, and delta-spark
4.4.1 on PyPI requires pyspark <= 4.2.0, while we run PySpark 4.3.0.
"""


def _value(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.2f}"
    return f"{v:.3f}"


def _rows(figures: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| figure | value | unit | runs | spread | compared with |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    for f in figures:
        anchor = str(f.get("anchor", "")).replace("|", "/")
        lines.append(
            f"| `{f['name']}` | {_value(float(f['value']))} | {f['unit']} | {f['runs']} | "
            f"{float(f['spread']):.0%} | {anchor} |"
        )
    return lines


def _provenance(results: dict[str, Any]) -> str:
    machine = results.get("machine", {})
    return (
        f"Results file last written {results.get('written_at', '?')}, "
        f"{results.get('mode', '?')} mode, on {machine.get('cpus', '?')} CPUs, "
        f"Python {machine.get('python', '?')}"
    )


def table(
    results: dict[str, Any],
    series: list[dict[str, Any]] | None = None,
    *,
    plots_link: str = PLOTS_LINK,
) -> str:
    """The results part of docs/benchmarks.md: every ratio against its anchor first,
    then links to the plots (``plots_link``: their folder as seen from the page),
    then every figure."""
    figures = results["figures"]
    ratios = [f for f in figures if str(f["name"]).endswith(".ratio")]
    versions = ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items())
    lines = [
        f"{_provenance(results)} (a suite rerun with `--only` merges into it); "
        "value is the median over the runs, spread is (max - min) / median.",
        "",
    ]
    if versions:
        lines += [f"Versions: {versions}.", ""]
    lines += [
        f"**Side by side** ({len(ratios)} ratios; each figure's note in the results file "
        "says which way round it is):",
        "",
        *_rows(ratios),
        "",
        f"![ratios]({plots_link}/plot_ratios.png)",
    ]
    if series:
        lines += ["", "Plots of how costs grow and of latency distributions:", ""]
        for s in series:
            png = f"{plots_link}/plot_{s['kind']}_{_slug(str(s['name']))}.png"
            lines.append(f"- [{s['title']}]({png})")
    lines += [
        "",
        f"<details><summary>All {len(figures)} figures</summary>",
        "",
        *_rows(figures),
        "",
        "</details>",
    ]
    return "\n".join(lines)


def render_benchmarks(results: dict[str, Any], series: list[dict[str, Any]] | None = None) -> str:
    """The whole of docs/benchmarks.md."""
    comparisons = "\n".join(
        [
            "| comparison | percolake | anchor |",
            "| --- | --- | --- |",
            *(f"| {what} | {ours} | {theirs} |" for what, ours, theirs in _COMPARISONS),
        ]
    )
    intro = _INTRO.replace("{comparisons}", comparisons)
    return f"{_GENERATED}\n\n{intro}\n## Results\n\n{table(results, series)}\n"


def readme_summary(results: dict[str, Any]) -> str:
    """The README's block: the contract's figures in one small table, and where the rest is."""
    by_name = {str(f["name"]): f for f in results["figures"]}
    lines = [
        "| figure | value | runs | spread | what it compares |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, what in CONTRACT_FIGURES.items():
        f = by_name.get(name)
        if f is None:  # a partial results file; the full run always has them (a test checks)
            lines.append(f"| `{name}` | not measured | | | {what} |")
            continue
        lines.append(
            f"| `{name}` | {_value(float(f['value']))} {f['unit']} | {f['runs']} | "
            f"{float(f['spread']):.0%} | {what} |"
        )
    ratios = sum(1 for f in results["figures"] if str(f["name"]).endswith(".ratio"))
    lines += [
        "",
        f"{_provenance(results)}; value is the median over the runs, spread is "
        f"(max - min) / median. All {len(results['figures'])} figures, the {ratios} "
        f"side-by-side ratios and the plots: [{BENCHMARKS_LINK}]({BENCHMARKS_LINK}).",
    ]
    return "\n".join(lines)


def readme_with_summary(readme: str, results: dict[str, Any]) -> str:
    """``readme`` with the block between the markers replaced by :func:`readme_summary`."""
    block = f"{START}\n{readme_summary(results)}\n{END}"
    if START not in readme or END not in readme:
        raise ValueError(f"README has no {START} ... {END} markers")
    return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, readme, flags=re.S)


def load_series(results_path: Path = RESULTS) -> list[dict[str, Any]]:
    """The growth curves and latency distributions written next to ``results_path``."""
    path = results_path.with_name(f"{results_path.stem}-series.json")
    return list(json.loads(path.read_text())["series"]) if path.exists() else []


def write_reports(
    results_path: Path = RESULTS,
    readme_path: Path = README,
    benchmarks_path: Path = BENCHMARKS,
) -> list[Path]:
    """Regenerate docs/benchmarks.md and the README's summary from ``results_path``."""
    results = json.loads(results_path.read_text())
    benchmarks_path.parent.mkdir(parents=True, exist_ok=True)
    benchmarks_path.write_text(render_benchmarks(results, load_series(results_path)))
    readme_path.write_text(readme_with_summary(readme_path.read_text(), results))
    return [benchmarks_path, readme_path]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def ahead_of_anchor(name: str, value: float) -> bool:
    """Whether a ratio shows percolake ahead (green in the plot): above 1, or below 1
    for an overhead or a store size left by garbage collection."""
    return (value >= 1) != any(part in name for part in _LOWER_IS_BETTER)


def plot(results_path: Path = RESULTS) -> list[Path]:
    """Draw every plot next to ``results_path``; returns the files written.

    Plots left from an earlier run are removed first, so the directory shows only
    what the results files hold.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = results_path.parent
    for old in folder.glob("plot_*.png"):
        old.unlink()
    results = json.loads(results_path.read_text())
    series = load_series(results_path)
    written = []

    ratios = [f for f in results["figures"] if str(f["name"]).endswith(".ratio")]
    if ratios:
        fig, ax = plt.subplots(figsize=(11, 0.42 * len(ratios) + 1.6))
        names = [str(f["name"]).removesuffix(".ratio") for f in ratios]
        values = [float(f["value"]) for f in ratios]
        errors = [float(f["value"]) * float(f["spread"]) / 2 for f in ratios]
        ahead = [ahead_of_anchor(n, v) for n, v in zip(names, values, strict=True)]
        colors = ["#55a868" if a else "#c44e52" for a in ahead]
        ax.barh(names, values, xerr=errors, color=colors)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel(
            "ratio against the anchor (log); green: percolake ahead, red: behind; whiskers: spread"
        )
        ax.invert_yaxis()
        ax.set_title("percolake against each anchor (Percolator: published; the rest: same run)")
        fig.tight_layout()
        path = folder / "plot_ratios.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    for s in series:
        fig, ax = plt.subplots(figsize=(8, 5))
        if s["kind"] == "growth":
            for label, points in s["lines"].items():
                xs = [float(x) for x, _ in points]
                ys = [float(y) for _, y in points]
                ax.plot(xs, ys, marker="o", label=label)
            ax.set_xlabel(s["x_label"])
            ax.set_ylabel(s["y_label"])
            if s.get("log_x", True):
                ax.set_xscale("log")
            if s.get("log_y", False):
                ax.set_yscale("log")
            prefix = "growth"
        else:
            for label, dist in s["distributions"].items():
                keys = [k for k in dist if k.startswith("p")]
                ps = [float(k[1:]) / 100 for k in keys]
                xs = [float(dist[k]) for k in keys]
                ax.plot(xs, ps, label=f"{label} (n={dist['count']:.0f})")
            ax.set_xscale("log")
            ax.set_xlabel(f"latency ({s['unit']}, log)")
            ax.set_ylabel("fraction of operations at or below")
            prefix = "latency"
        ax.set_title(s["title"], fontsize=11)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / f"plot_{prefix}_{_slug(s['name'])}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report",
        description=(
            "Regenerate docs/benchmarks.md and the README's summary from "
            "bench/results/latest.json, without running any benchmark."
        ),
    )
    parser.add_argument("--plots", action="store_true", help="redraw the PNG plots as well")
    args = parser.parse_args(argv)
    for path in write_reports():
        print(f"wrote {path}")
    if args.plots:
        for png in plot():
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
