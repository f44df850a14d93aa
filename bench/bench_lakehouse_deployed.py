"""Lakehouse appends in the topology users deploy: writer *processes*, each with its
own remote manager, through a real ``percolake serve`` process; Delta Lake and Iceberg
writers as processes too, on the same machine, in the same run.

What one run measures: N writer processes (1, 2, 4, 8 and 16; quick mode 1 and 8)
append one-file, metadata-only commits to one new, empty table for a fixed time.

* percolake: each process opens ``TransactionManager.remote(gateway)`` and
  ``Lakehouse(tm, warehouse)`` (``spark_integration``) and calls
  ``lh.append_files(table, [DataFile(path, size, 10)])``, the path a fresh hard link
  of one 10-row Parquet file in the writer's own job folder
  ``<location>/_lh_job=w<index>/``. The gateway is ``python -m percolake serve``
  (oracle, lock server and gateway in one process) on SQLite, on a one-node
  Cassandra, and on a three-node Cassandra with replication factor 3 (the last two
  in full mode only), one gateway per store and writer count.
* Delta Lake (delta-rs): each process opens the table's own ``DeltaTable`` and
  commits ``create_write_transaction`` with one ``AddAction``.
* Iceberg (pyiceberg ``SqlCatalog`` on SQLite, local file warehouse): each process
  loads the table through its own catalog object and commits
  ``Table.add_files([path], check_duplicate_files=False)`` of a fresh hard link of one
  10-row file (pyiceberg retries a conflict itself; a commit that still fails is
  retried on a reloaded table, up to 20 times). SQLite phase only.

Spawn and import time are excluded: the writer processes (``multiprocessing`` with
'spawn') are started once, import everything, and then, for each run, open their
handles (connected, table loaded), report ready, and wait on one shared event; the
parent releases them all together and each runs its commit loop until the same
deadline. The rate counts successful commits until the last writer's last commit
returned; a commit that raises is a failed commit (not in the rate or latencies).
Every system runs on the same machine in the same run, the order of the systems
rotated from run to run, so each ratio pairs runs made back to back.

Where the time goes: with ``PERCOLAKE_BENCH_PROFILE=cprofile`` each gateway runs
under a per-thread cProfile (``profile-serve`` below) and a summary (top functions,
RPCs per commit) is written next to the ``.prof`` file; with ``=py-spy`` (when
``py-spy`` is on the PATH) py-spy records the gateway's stacks. Files go to
``$PERCOLAKE_BENCH_PROFILE_DIR`` (default ``.percolake/bench-profiles``). Profiling
slows the gateway: figures of such a run are for finding costs, not for the record.

``python -m bench --only bench.bench_lakehouse_deployed`` runs this suite and merges
its figures into ``bench/results/latest.json``. One phase on its own, for example
issue 27's three-node figures: ``python -m bench.bench_lakehouse_deployed --store
cassandra --writers 1 --writers 8 --write`` (the three-node ratios are named both
``lakehouse.appends.cassandra.writers8...`` and ``...cassandra3.writers8...``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import logging
import multiprocessing
import os
import pstats
import runpy
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from bench._lakehouse_anchors import version_of
from bench._load import end_processes, receive, start_processes
from bench._proc_cpu import cpu_seconds, jit_cpu_seconds, listening_pids
from bench._results import Figure, Growth, Latency, Result, summarize

log = logging.getLogger(__name__)

WRITER_COUNTS = (1, 2, 4, 8, 16)
QUICK_WRITER_COUNTS = (1, 8)
#: The store phases: SQLite, Cassandra one node, Cassandra three nodes (RF 3).
SQLITE, CASSANDRA1, CASSANDRA3 = "sqlite", "cassandra1", "cassandra"
#: A ``cassandra://`` contact point without a port is on Cassandra's native port.
CASSANDRA_DEFAULT_PORT = 9042
#: Whose CPU a run measures: the writer processes, and for percolake its gateway and the
#: store's server processes (see ``measure_phase``).
CPU_ROLES = ("store", "gateway", "writers")
STORE_LABEL = {
    SQLITE: "SQLite",
    CASSANDRA1: "Cassandra 5.0 one node",
    CASSANDRA3: "Cassandra 5.0 three nodes, replication factor 3",
}
PERCOLAKE, DELTA, ICEBERG = "percolake", "deltalake", "iceberg"
#: The prefixes of each phase's 8-writer ratios. The three-node phase keeps the second
#: wave's contract name (``cassandra``) and also gives the third wave's (``cassandra3``,
#: issue 27's goals): the same paired runs under both names.
RATIO_NAMES = {
    SQLITE: ("lakehouse.appends.writers8",),
    CASSANDRA1: ("lakehouse.appends.cassandra1.writers8",),
    CASSANDRA3: ("lakehouse.appends.cassandra.writers8", "lakehouse.appends.cassandra3.writers8"),
}

#: A store served by JVMs (Cassandra) is measured warm: before its first measured run,
#: percolake's writers load it in rounds of runs of WARMUP_RUN_S (one per writer count),
#: at least WARMUP_MIN_ROUNDS rounds, until the rate no longer climbs (at most
#: WARM_RATE_STEP over the round before) while the JIT compiler threads spend at most
#: WARM_JIT_SHARE of the store's CPU over the round, or for at most
#: WARMUP_S (``--warmup-s``). A node compiles its hot code for minutes after it starts,
#: and again after it idled or when the load changes; servers in production run warm,
#: and runs on a cold cluster measured the compiler (up to two thirds of the nodes' CPU
#: in the first runs). A low share alone is not enough: a node that had idled ran its
#: first run slowly with little compiling, and compiled in the runs after it.
WARMUP_S = 600.0
WARMUP_RUN_S = 10.0
WARMUP_MIN_ROUNDS = 3
WARM_JIT_SHARE = 0.05
WARM_RATE_STEP = 1.1
#: A writer's open (connect, load the table) and a run's collection are bounded.
READY_TIMEOUT_S = 120.0
#: Past the deadline, the longest one commit may still take before a writer is given up.
STRAGGLER_S = 90.0
#: Part-file numbers of writer ``i`` start at ``i * PART_STRIDE``: unique across writers.
PART_STRIDE = 10_000_000
SOURCE_ROWS = 10

TABLE = "events"
DELTA_RS = f"delta-rs {version_of('deltalake')}"
PYICEBERG = f"pyiceberg {version_of('pyiceberg')} SqlCatalog on SQLite, local file warehouse"

PROFILE_ENV = "PERCOLAKE_BENCH_PROFILE"
PROFILE_DIR_ENV = "PERCOLAKE_BENCH_PROFILE_DIR"
DEFAULT_PROFILE_DIR = Path(".percolake") / "bench-profiles"

T = TypeVar("T")


def _rotated(items: Sequence[T], by: int) -> list[T]:
    """``items`` rotated left by ``by``: run ``n`` starts with a different system."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


# --- what a writer process does --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    """What one writer process opens for one run (sent to it through its pipe)."""

    system: str
    index: int
    seconds: float
    root: str  # deltalake / iceberg: the folder holding the table
    gateway: str = ""  # percolake: the gateway's HOST:PORT
    warehouse: str = ""
    table: str = ""
    source: str = ""  # a 10-row Parquet file to hard-link for each commit
    #: Stop after this many successful commits (0: run until the deadline only).
    commits: int = 0
    #: Added to this writer's part-file numbers: a later run of one table's writers
    #: goes on where the last left off.
    part_offset: int = 0
    #: ``"module:Class"`` of a writer another suite brings (built as ``Class(spec)``);
    #: empty: the writer of ``system``.
    writer: str = ""


@dataclass(slots=True)
class WriterRun:
    """One writer's run, sent back to the parent."""

    done: int = 0
    failed: int = 0
    finished_at: float = 0.0  # time.monotonic() after its last commit returned
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the first few failures
    extras: dict[str, int] = field(default_factory=dict)


class Writer(Protocol):
    def append(self, n: int) -> None: ...
    def extras(self) -> dict[str, int]: ...
    def close(self) -> None: ...


class PercolakeWriter:
    """``Lakehouse(TransactionManager.remote(gateway), warehouse).append_files``; each
    commit's data file is a hard link to one source file (no bytes written)."""

    def __init__(self, spec: Spec) -> None:
        from spark_integration import Lakehouse
        from txn import TransactionManager

        self.tm = TransactionManager.remote(spec.gateway)
        self.lh = Lakehouse(self.tm, spec.warehouse)
        self.table = spec.table
        self.source = spec.source
        self.size = self._size(spec.source)
        self.folder = self._folder(spec)
        self.lh.version(self.table)  # connected, table loaded: the handle is open

    def _folder(self, spec: Spec) -> str:
        folder = Path(spec.warehouse) / spec.table / f"_lh_job=w{spec.index}"
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    def _size(self, source: str) -> int:
        return os.path.getsize(source)

    def _place(self, source: str, path: str) -> None:
        os.link(source, path)

    def append(self, n: int) -> None:
        from spark_integration import DataFile

        path = f"{self.folder}/part-{n:09d}.parquet"
        self._place(self.source, path)
        self.lh.append_files(self.table, [DataFile(path, self.size, SOURCE_ROWS)])

    def extras(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self.tm.close()


class DeltaWriter:
    """delta-rs ``create_write_transaction`` of one ``AddAction``, own ``DeltaTable``."""

    def __init__(self, spec: Spec) -> None:
        from bench._lakehouse_anchors import DeltaAppends

        self.delta = DeltaAppends(Path(spec.root), create=False)
        self.delta.open()

    def append(self, n: int) -> None:
        self.delta.append(n)

    def extras(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


class IcebergWriter:
    """pyiceberg ``add_files`` of one file, own catalog object and table handle."""

    def __init__(self, spec: Spec, retries: Any) -> None:
        from bench._lakehouse_anchors import IcebergAppends

        self.ice = IcebergAppends(Path(spec.root), create=False)
        self.ice.open()
        self.retries = retries
        self.retries_before = int(retries.count)

    def append(self, n: int) -> None:
        self.ice.append(n)

    def extras(self) -> dict[str, int]:
        return {
            "pyiceberg_retries": int(self.retries.count) - self.retries_before,
            "reloads": self.ice.reloads,
        }

    def close(self) -> None:
        self.ice.close()


def _commit_loop(writer: Writer, spec: Spec, start_at: float) -> WriterRun:
    """Commit until ``start_at + spec.seconds`` (or ``spec.commits`` succeeded, when
    set); every loop ends at that deadline."""
    out = WriterRun()
    stop = start_at + spec.seconds
    k = spec.index * PART_STRIDE + spec.part_offset
    while time.monotonic() < stop and not 0 < spec.commits <= out.done:
        k += 1
        began = time.perf_counter()
        try:
            writer.append(k)
        except Exception as error:
            out.failed += 1
            if len(out.errors) < 3:
                out.errors.append(f"{type(error).__name__}: {error}"[:500])
            continue
        out.latencies_ms.append((time.perf_counter() - began) * 1000)
        out.done += 1
    out.finished_at = time.monotonic()
    out.extras = writer.extras()
    return out


def _writer_main(conn: Connection, go: Event, start_at: Any, systems: tuple[str, ...]) -> None:
    """A writer process: import what ``systems`` need, then serve runs until told to stop."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Imported before reporting ready: import time is not part of any run.
    import pyarrow.parquet  # noqa: F401

    from bench._lakehouse_anchors import pyiceberg_retries

    if PERCOLAKE in systems:
        import spark_integration  # noqa: F401
        import txn  # noqa: F401
    if DELTA in systems:
        import deltalake  # noqa: F401
    if ICEBERG in systems:
        import pyiceberg.catalog.sql  # noqa: F401

    with pyiceberg_retries() as retries:
        conn.send(("hello", os.getpid()))
        while True:
            spec: Spec | None = conn.recv()
            if spec is None:
                return
            try:
                writer: Writer
                if spec.writer:
                    module, _, name = spec.writer.partition(":")
                    writer = getattr(importlib.import_module(module), name)(spec)
                elif spec.system == PERCOLAKE:
                    writer = PercolakeWriter(spec)
                elif spec.system == DELTA:
                    writer = DeltaWriter(spec)
                else:
                    writer = IcebergWriter(spec, retries)
            except Exception:
                conn.send(("error", traceback.format_exc()))
                continue
            try:
                conn.send(("ready", None))
                if not go.wait(READY_TIMEOUT_S):
                    conn.send(("error", "never released"))
                    continue
                conn.send(("done", _commit_loop(writer, spec, float(start_at.value))))
            finally:
                writer.close()


@dataclass(slots=True)
class Run:
    """One system's run with N writers."""

    writers: int
    commits: int
    rate: float
    failed: int
    latencies_ms: list[float]
    errors: list[str]
    extras: Counter[str]
    #: CPU seconds of each role's processes over the run (see ``measure_phase``).
    cpu_s: dict[str, float] = field(default_factory=dict)
    #: percolake: its gateway's commits per group transaction over the run.
    commits_per_group: float | None = None
    #: CPU seconds the store's JIT compiler threads used over the run (in ``cpu_s``'s
    #: "store"; none without server processes).
    jit_s: float | None = None

    def cpu_ms_per_commit(self, role: str | None = None) -> float:
        """CPU milliseconds a commit of ``role``'s processes (``None``: every role's)."""
        seconds = sum(self.cpu_s.values()) if role is None else self.cpu_s[role]
        return seconds * 1000 / self.commits if self.commits else float("nan")

    def percentile_ms(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class WriterPool:
    """Writer processes started once ('spawn'), each running :func:`_writer_main`;
    stopped on exit, by their own pids."""

    def __init__(self, size: int, systems: tuple[str, ...]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.go = ctx.Event()
        self.start_at = ctx.RawValue("d", 0.0)
        self.procs, self.conns = start_processes(
            ctx,
            _writer_main,
            (self.go, self.start_at, systems),
            size,
            "bench-writer",
            READY_TIMEOUT_S,
        )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def _recv(self, i: int, timeout_s: float) -> tuple[str, Any]:
        return receive(self.procs[i], self.conns[i], timeout_s)

    def run(
        self,
        specs: Sequence[Spec],
        seconds: float,
        on_release: Callable[[], None] = lambda: None,
    ) -> Run:
        """One run: open every writer's handle, release them together, collect.
        ``on_release`` is called once every writer is open, just before the release."""
        self.go.clear()
        for spec in specs:
            self.conns[spec.index].send(spec)
        ready: list[int] = []
        errors: list[str] = []
        for spec in specs:
            kind, payload = self._recv(spec.index, READY_TIMEOUT_S)
            if kind == "ready":
                ready.append(spec.index)
            else:
                errors.append(f"writer {spec.index}: {payload}")
        if errors:
            # Release the ones that opened with a deadline already past, so they idle again.
            self.start_at.value = time.monotonic() - seconds - 1
            self.go.set()
            for i in ready:
                self._recv(i, STRAGGLER_S)
            raise RuntimeError("writers failed to open:\n" + "\n".join(errors))
        on_release()
        started = time.monotonic()
        self.start_at.value = started
        self.go.set()
        runs: list[WriterRun] = []
        for spec in specs:
            kind, payload = self._recv(spec.index, seconds + STRAGGLER_S)
            if kind != "done":
                raise RuntimeError(f"writer {spec.index}: {payload}")
            runs.append(payload)
        elapsed = max(r.finished_at for r in runs) - started
        extras: Counter[str] = Counter()
        for r in runs:
            extras.update(r.extras)
        return Run(
            writers=len(specs),
            commits=sum(r.done for r in runs),
            rate=sum(r.done for r in runs) / elapsed,
            failed=sum(r.failed for r in runs),
            latencies_ms=[ms for r in runs for ms in r.latencies_ms],
            errors=[e for r in runs for e in r.errors][:5],
            extras=extras,
        )

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        end_processes(self.procs, self.conns)

    def __enter__(self) -> WriterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the gateway, and profiling it -----------------------------------------------------


def _profile_mode() -> str | None:
    mode = os.environ.get(PROFILE_ENV, "").strip().lower()
    if not mode:
        return None
    if mode not in ("cprofile", "py-spy"):
        raise ValueError(f"{PROFILE_ENV}={mode!r}: expected 'cprofile' or 'py-spy'")
    if mode == "py-spy" and shutil.which("py-spy") is None:
        log.warning("%s=py-spy but py-spy is not on the PATH: profiling with cProfile", PROFILE_ENV)
        return "cprofile"
    return mode


def _profile_dir() -> Path:
    folder = Path(os.environ.get(PROFILE_DIR_ENV) or DEFAULT_PROFILE_DIR).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass(slots=True)
class Gateway:
    """A running ``percolake serve`` and the commits made through it so far."""

    address: str
    commits: int = 0
    pid: int = 0
    #: Its Prometheus endpoint's port (``--metrics-listen``).
    metrics_port: int = 0

    def group_commits(self) -> tuple[float, float]:
        """The gateway's ``percolake_lakehouse_group_commits`` so far: (commits, groups)."""
        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as got:
            text = got.read().decode()
        found = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "percolake_lakehouse_group_commits"
            for sample in family.samples
        }
        name = "percolake_lakehouse_group_commits"
        return found.get(f"{name}_sum", 0.0), found.get(f"{name}_count", 0.0)


@contextlib.contextmanager
def gateway(
    store_url: str, workdir: Path, label: str, args: Sequence[str] = ()
) -> Iterator[Gateway]:
    """A ``percolake serve`` process (oracle, locks and gateway) on ``store_url``, with
    ``args`` added to its command line, under a profiler when :data:`PROFILE_ENV` asks
    for one; stopped on exit."""
    from percolake.tools.ports import free_ports
    from tests.servers import SERVE, ServerProcess

    mode = _profile_mode()
    profile = _profile_dir() / f"gateway-{label}" if mode else None
    command: Sequence[str] = SERVE
    if mode == "cprofile" and profile is not None:
        command = ("bench.bench_lakehouse_deployed", "profile-serve", f"{profile}.prof", "serve")
    (metrics_port,) = free_ports(1)
    argv = ["--store", store_url, "--metrics-listen", f"127.0.0.1:{metrics_port}", *args]
    server = ServerProcess("all", argv, workdir, command=command).start()
    spy: subprocess.Popen[bytes] | None = None
    if mode == "py-spy" and profile is not None:
        spy = subprocess.Popen(
            [
                *("py-spy", "record", "--pid", str(server.pid), "--rate", "200"),
                *("--nonblocking", "--format", "raw", "--output", f"{profile}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    running = Gateway(server.address, pid=server.pid, metrics_port=metrics_port)
    try:
        yield running
    finally:
        code = server.stop()
        if code not in (0, None):
            log.warning("gateway on %s exited %s: %s", label, code, server.output()[-2000:])
        if spy is not None:
            try:
                spy.wait(30)  # py-spy ends when its target does
            except subprocess.TimeoutExpired:
                spy.send_signal(signal.SIGINT)
                try:
                    spy.wait(15)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait(5)
        if mode == "cprofile" and profile is not None:
            _summarize_profile(Path(f"{profile}.prof"), running.commits)
        if profile is not None:
            print(f"gateway profile ({mode}): {profile}.*", file=sys.stderr, flush=True)


def _rpc_methods() -> set[str]:
    """The names of every gRPC method percolake serves (from the generated modules)."""
    import pkgutil

    import wire.v1

    names: set[str] = set()
    for module in pkgutil.iter_modules(wire.v1.__path__):
        if module.name.endswith("_pb2"):
            descriptor = importlib.import_module(f"wire.v1.{module.name}").DESCRIPTOR
            for service in descriptor.services_by_name.values():
                names.update(method.name for method in service.methods)
    return names


def _summarize_profile(prof: Path, commits: int) -> None:
    """``<prof>.txt``: RPCs per commit by method, the top functions by own and total time."""
    if not prof.exists():
        log.warning("no profile written at %s", prof)
        return
    stats = pstats.Stats(str(prof))
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
    raw = stats.stats  # type: ignore[attr-defined]
    methods = _rpc_methods()
    rpcs: Counter[str] = Counter()
    for (filename, _, name), (_, calls, _, _, _) in raw.items():
        # A servicer's method of the same name as the RPC; a client's stub call is
        # not in this (server) process.
        if name in methods and os.path.basename(filename) != "__init__.py":
            rpcs[name] += calls
    with prof.with_suffix(".txt").open("w") as out:
        per = max(commits, 1)
        out.write(f"{commits} commits through this gateway\n\nRPCs served, per commit:\n")
        for name, calls in rpcs.most_common():
            out.write(f"  {name:24s} {calls:>9d}  {calls / per:8.2f}\n")
        out.write(f"  {'all':24s} {sum(rpcs.values()):>9d}  {sum(rpcs.values()) / per:8.2f}\n\n")
        for key in ("tottime", "cumulative"):
            out.write(f"--- top 40 by {key} ---\n")
            pstats.Stats(str(prof), stream=out).sort_stats(key).print_stats(40)


def profiled_serve(out: Path, argv: Sequence[str]) -> int:
    """``percolake <argv>`` with every thread under its own cProfile; the merged
    profile is written to ``out`` when the server returns (SIGTERM stops it cleanly)."""
    profiles: list[cProfile.Profile] = []
    guard = threading.Lock()

    def on_thread_start(frame: FrameType, event: str, arg: object) -> None:
        # Replaces this hook, in this thread only, by the thread's own profiler.
        profiler = cProfile.Profile()
        with guard:
            profiles.append(profiler)
        profiler.enable()

    main = cProfile.Profile()
    profiles.append(main)
    threading.setprofile(on_thread_start)
    sys.argv = ["percolake", *argv]
    code: int | str | None = 0
    main.enable()
    try:
        runpy.run_module("percolake", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
    finally:
        main.disable()
        threading.setprofile(None)
        with guard:
            for profiler in profiles:
                profiler.create_stats()
            stats = pstats.Stats(profiles[0])
            for profiler in profiles[1:]:
                stats.add(profiler)
        stats.dump_stats(str(out))
    return code if isinstance(code, int) else 1


# --- the stores ------------------------------------------------------------------------


@contextlib.contextmanager
def store_url(store: str, root: Path) -> Iterator[str]:
    """The store URL of one phase; for Cassandra, a cluster started for it (and stopped)."""
    if store == SQLITE:
        yield f"sqlite:///{root}/store.db"
        return
    from percolake.tools.cassandra import start_on_free_ports
    from storage_adapters import open_store

    nodes = 3 if store == CASSANDRA3 else 1
    # Addresses of our own, away from 127.0.0.1-3 that tests and other benchmarks use.
    first = 41 if nodes == 3 else 45
    cluster = start_on_free_ports(
        nodes,
        root / f"cassandra-{store}",
        cluster_name=f"percolake-bench-{store}",
        first_address=first,
    )
    try:
        options: dict[str, object] = {"replication_factor": 3} if nodes == 3 else {}
        url = cluster.store_url("percolake_deployed", **options)
        open_store(url).close()  # the keyspace and tables, before any gateway starts
        yield url
    finally:
        cluster.stop()


# --- one phase: a store, every writer count, every system ------------------------------


@dataclass(slots=True)
class Phase:
    store: str
    systems: tuple[str, ...]
    seconds: float
    runs: int
    results: dict[tuple[str, int], list[Run]] = field(default_factory=dict)
    #: How the store was warmed before the first measured run (empty: no JVM store).
    warmup: str = ""

    def rates(self, system: str, writers: int) -> list[float]:
        return [r.rate for r in self.results[system, writers]]


def store_server_pids(url: str) -> list[int]:
    """The processes on this machine serving the store at ``url``: a Cassandra URL's
    nodes (by their listening sockets); none for SQLite, which runs inside the gateway."""
    if not url.startswith("cassandra://"):
        return []
    addresses: set[tuple[str, int]] = set()
    for contact in urlsplit(url).netloc.split(","):
        host, _, port = contact.rpartition(":")
        addresses.add((host, int(port)) if host else (contact, CASSANDRA_DEFAULT_PORT))
    return listening_pids(addresses)


def _write_source(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": pa.array(range(SOURCE_ROWS), pa.int64())}), str(path))


def _prepare(system: str, folder: Path, writers: int, seconds: float, gw: str) -> list[Spec]:
    """A new empty table for one run of ``system``; its writers' specs. percolake's
    table names are per store, so each run's table is named after its folder and this
    process (a store given with ``--url`` keeps the tables of earlier invocations)."""
    folder.mkdir(parents=True)
    if system == PERCOLAKE:
        from pyspark.sql.types import LongType, StructField, StructType

        from spark_integration import Lakehouse
        from txn import TransactionManager

        source = folder / "source.parquet"
        _write_source(source)
        warehouse = folder / "warehouse"
        table = f"{TABLE}_{folder.name}_p{os.getpid()}"
        with TransactionManager.remote(gw) as tm:
            Lakehouse(tm, warehouse).create_table(
                table, StructType([StructField("id", LongType())])
            )
        return [
            Spec(PERCOLAKE, i, seconds, str(folder), gw, str(warehouse), table, str(source))
            for i in range(writers)
        ]
    if system == DELTA:
        from bench._lakehouse_anchors import DeltaAppends

        DeltaAppends(folder)
    else:
        from bench._lakehouse_anchors import IcebergAppends

        IcebergAppends(folder).close()
    return [Spec(system, i, seconds, str(folder)) for i in range(writers)]


def _measured_run(
    pool: WriterPool, specs: Sequence[Spec], seconds: float, gw: Gateway | None, store: list[int]
) -> Run:
    """``pool.run``, with the CPU seconds each role's processes used from the release
    of the writers (once open) to the end of the run: the writer processes, and with a
    gateway (percolake's run) also the gateway and the ``store`` server processes (none
    for SQLite, which runs in the gateway) and their JIT compiler threads; and the
    gateway's commits per group over the run."""
    roles = {"writers": pool.pids}
    if gw is not None:
        roles["gateway"] = [gw.pid]
        if store:
            roles["store"] = store

    def counters() -> dict[str, float]:
        now = {role: cpu_seconds(pids) for role, pids in roles.items()}
        if "store" in roles:
            now["jit"] = jit_cpu_seconds(store)
        if gw is not None:
            now["commits"], now["groups"] = gw.group_commits()
        return now

    before: dict[str, float] = {}
    got = pool.run(specs, seconds, lambda: before.update(counters()))
    spent = {key: value - before[key] for key, value in counters().items()}
    got.cpu_s = {role: spent[role] for role in roles}
    got.jit_s = spent.get("jit")
    if "groups" in spent:
        got.commits_per_group = spent["commits"] / spent["groups"] if spent["groups"] else None
    return got


def warm_up(
    pool: WriterPool,
    url: str,
    root: Path,
    writer_counts: Sequence[int],
    store: list[int],
    budget_s: float,
    progress: Callable[[str], None],
) -> str:
    """Load the store's JVMs (``store``) with percolake's writers until they are warm
    (see :data:`WARMUP_S`), in rounds of one run per writer count of the phase: a
    node compiles each load's paths, and compiles again when the load changes (the
    measured runs alternate writer counts). What was done, for the figures' notes."""
    if not store or budget_s <= 0:
        return "no warm-up" if store else ""
    started = time.monotonic()
    rates: list[float] = []  # of the round's largest writer count
    share, warm = 1.0, False
    with gateway(url, root, "warmup") as gw:
        while not warm and time.monotonic() - started < budget_s:
            jit_s = store_s = 0.0
            for writers in sorted(writer_counts):
                folder = root / f"warmup{len(rates)}_{writers}"
                specs = _prepare(PERCOLAKE, folder, writers, WARMUP_RUN_S, gw.address)
                got = _measured_run(pool, specs, WARMUP_RUN_S, gw, store)
                jit_s, store_s = jit_s + (got.jit_s or 0.0), store_s + got.cpu_s["store"]
                shutil.rmtree(folder, ignore_errors=True)
            share = jit_s / store_s if store_s else 0.0
            rates.append(got.rate)
            warm = is_warm(rates, share)
            progress(
                f"warm-up round {len(rates)}: {got.rate:.1f} commits/s with {writers} "
                f"writers, the store's JIT {share:.0%} of its CPU"
            )
    elapsed = time.monotonic() - started
    outcome = "reached" if warm else "not reached"
    return (
        f"measured warm: {len(rates)} warm-up round(s) of {WARMUP_RUN_S:g} s runs with "
        f"{', '.join(map(str, sorted(writer_counts)))} writers, {elapsed:.0f} s, until the "
        f"largest count's rate stopped climbing with the store's JIT compiler threads at "
        f"most {WARM_JIT_SHARE:.0%} of its CPU over a round ({outcome}: "
        f"the last round {rates[-1] if rates else 0:.0f} commits/s, JIT {share:.0%})"
    )


def is_warm(rates: Sequence[float], jit_share: float) -> bool:
    """Whether warm-up rounds at ``rates`` (oldest first), the last with the store's JIT
    at ``jit_share`` of its CPU, leave the store warm (see :data:`WARMUP_S`)."""
    return (
        len(rates) >= WARMUP_MIN_ROUNDS
        and jit_share <= WARM_JIT_SHARE
        and rates[-1] <= rates[-2] * WARM_RATE_STEP
    )


def measure_phase(
    pool: WriterPool,
    store: str,
    url: str,
    root: Path,
    writer_counts: Sequence[int],
    systems: tuple[str, ...],
    seconds: float,
    runs: int,
    progress: Callable[[str], None],
    warmup_s: float = WARMUP_S,
) -> Phase:
    """Every writer count, ``runs`` paired runs of every system (order rotated), one
    gateway on ``url`` per writer count; after a warm-up of a JVM store (:func:`warm_up`)."""
    phase = Phase(store, systems, seconds, runs)
    servers = store_server_pids(url)
    phase.warmup = warm_up(pool, url, root, writer_counts, servers, warmup_s, progress)
    for i, writers in enumerate(writer_counts):
        progress(f"lakehouse.appends.deployed.{store}.writers{writers}")
        with gateway(url, root, f"{store}-writers{writers}") as gw:
            for run in range(runs):
                for system in _rotated(systems, i + run):
                    folder = root / f"writers{writers}_run{run}_{system}"
                    specs = _prepare(system, folder, writers, seconds, gw.address)
                    ours = gw if system == PERCOLAKE else None
                    got = _measured_run(pool, specs, seconds, ours, servers)
                    if system == PERCOLAKE:
                        gw.commits += got.commits
                    phase.results.setdefault((system, writers), []).append(got)
                    log.info("%s %s writers%d: %.1f commits/s", store, system, writers, got.rate)
                    if got.failed:
                        log.warning(
                            "%s %s, %d writers: %d failed commits, e.g. %s",
                            store,
                            system,
                            writers,
                            got.failed,
                            got.errors[:1],
                        )
                    shutil.rmtree(folder, ignore_errors=True)
    return phase


# --- figures ---------------------------------------------------------------------------


def _topology(store: str, writers: int | str) -> str:
    return (
        f"{writers} writer process(es) (multiprocessing spawn, spawn and import time "
        "excluded), each with its own TransactionManager.remote and Lakehouse, through one "
        f"'percolake serve' process (oracle, locks, gateway) on {STORE_LABEL[store]}, same "
        "machine"
    )


def _anchor_topology(system: str, writers: int | str) -> str:
    if system == DELTA:
        return (
            f"Delta Lake ({DELTA_RS}): {writers} writer process(es), each with its own "
            "DeltaTable, create_write_transaction of one AddAction per commit, local disk"
        )
    return (
        f"Apache Iceberg ({PYICEBERG}): {writers} writer process(es), each with its own "
        "catalog object and table, add_files of one 10-row Parquet file per commit"
    )


def _paired(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    return [a / b if b else float("inf") for a, b in zip(ours, theirs, strict=True)]


def _system_figures(
    phase: Phase, system: str, writers: int, prefix: str, note: str
) -> list[Figure]:
    runs = phase.results[system, writers]
    anchor = (
        f"{_anchor_topology(DELTA, writers)}; same machine, same run"
        if system == PERCOLAKE
        else _anchor_topology(system, writers)
    )
    failed = sum(r.failed for r in runs)
    extras: Counter[str] = Counter()
    for r in runs:
        extras.update(r.extras)
    detail = "".join(f", {k} {v}" for k, v in sorted(extras.items()))
    errors = [e for r in runs for e in r.errors][:2]
    failed_note = f"{note}; total over {len(runs)} run(s){detail}" + (
        f"; first errors: {' | '.join(errors)}" if errors else ""
    )
    sampled = [r for r in runs if r.latencies_ms]
    figures = [
        summarize(
            f"{prefix}.commits_per_s", "commits/s", anchor, [r.rate for r in runs], note + detail
        ),
        Figure(
            f"{prefix}.failed_commits",
            float(failed),
            "commits",
            len(runs),
            0.0,
            anchor,
            failed_note,
        ),
    ]
    figures += _cpu_figures(runs, prefix, anchor, note)
    grouped = [r.commits_per_group for r in runs if r.commits_per_group is not None]
    if grouped:
        figures.append(
            summarize(
                f"{prefix}.commits_per_group",
                "commits",
                anchor,
                grouped,
                f"{note}; the gateway's percolake_lakehouse_group_commits over each run "
                "(commits / group transactions), median of runs",
            )
        )
    if sampled:
        figures += [
            summarize(
                f"{prefix}.{name}_ms",
                "ms",
                anchor,
                [r.percentile_ms(p) for r in sampled],
                f"{note}; commit latency {name} of each run (successful commits), median of runs",
            )
            for name, p in (("p50", 50.0), ("p99", 99.0))
        ]
    return figures


def _cpu_figures(runs: Sequence[Run], prefix: str, anchor: str, note: str) -> list[Figure]:
    """CPU milliseconds per commit of each role measured in every run, and their sum."""
    roles = [role for role in CPU_ROLES if runs and all(role in r.cpu_s for r in runs)]
    if not roles:
        return []
    how = (
        "user + system CPU of the processes over each run / the run's commits, median of "
        "runs (the store's: its server processes on this machine, their idle work included)"
    )
    figures = [
        summarize(
            f"{prefix}.cpu_ms_per_commit.{role}",
            "ms",
            anchor,
            [r.cpu_ms_per_commit(role) for r in runs],
            f"{note}; {role}: {how}",
        )
        for role in roles
    ]
    jit = [r.jit_s * 1000 / r.commits for r in runs if r.jit_s is not None and r.commits]
    if jit and len(jit) == len(runs):
        figures.append(
            summarize(
                f"{prefix}.cpu_ms_per_commit.store_jit",
                "ms",
                anchor,
                jit,
                f"{note}; the part of the store's CPU its JVMs' JIT compiler threads used "
                "(C1 and C2 CompilerThread): a node warming up after a start, an idle spell or "
                "a change of load, not a cost of commits",
            )
        )
    if len(roles) > 1:
        figures.append(
            summarize(
                f"{prefix}.cpu_ms_per_commit",
                "ms",
                anchor,
                [r.cpu_ms_per_commit() for r in runs],
                f"{note}; {' + '.join(roles)}: {how}",
            )
        )
    return figures


def phase_figures(phase: Phase, writer_counts: Sequence[int]) -> list[Result]:
    store = phase.store
    how = (
        f"{phase.runs} run(s) of {phase.seconds:g} s per system and writer count, each on a "
        "new empty table, system order rotated per run; one-file metadata-only appends"
        + (f"; {phase.warmup}" if phase.warmup else "")
    )
    results: list[Result] = []
    for writers in writer_counts:
        topology = _topology(store, writers)
        results += _system_figures(
            phase,
            PERCOLAKE,
            writers,
            f"lakehouse.appends.deployed.{store}.writers{writers}",
            f"{topology}; {how}",
        )
        if store == SQLITE:
            for system in phase.systems:
                if system != PERCOLAKE:
                    results += _system_figures(
                        phase,
                        system,
                        writers,
                        f"{system}.appends.deployed.writers{writers}",
                        f"{_anchor_topology(system, writers)}; {how}; run beside percolake's "
                        "gateway on SQLite",
                    )
    if 8 not in writer_counts or 1 not in writer_counts:
        return results
    ours8 = phase.rates(PERCOLAKE, 8)
    theirs8 = phase.rates(DELTA, 8)
    delta_note = (
        f"{_topology(store, 8)}; against {_anchor_topology(DELTA, 8)} "
        f"(in this phase: {statistics.median(theirs8):.1f} commits/s); {how}; percolake "
        "commits/s / deltalake commits/s of paired runs (back to back)"
    )
    delta_anchor = f"{_anchor_topology(DELTA, 8)}; same machine, same run"
    for name in RATIO_NAMES[store]:
        results.append(
            summarize(
                f"{name}.vs_deltalake.ratio",
                "x",
                delta_anchor,
                _paired(ours8, theirs8),
                delta_note,
            )
        )
        results.append(
            summarize(
                f"{name}.vs_writers1.ratio",
                "x",
                f"percolake itself with 1 writer process, same gateway topology on "
                f"{STORE_LABEL[store]}, same run",
                _paired(ours8, phase.rates(PERCOLAKE, 1)),
                f"{_topology(store, '8 and 1')}; {how}; commits/s with 8 writer processes / "
                "with 1, run n against run n",
            )
        )
    ours_runs, theirs_runs = phase.results[PERCOLAKE, 8], phase.results[DELTA, 8]
    if all(r.cpu_s for r in (*ours_runs, *theirs_runs)):
        theirs_cpu = [r.cpu_ms_per_commit() for r in theirs_runs]
        results.append(
            summarize(
                f"lakehouse.appends.deployed.{store}.writers8.cpu_per_commit.vs_deltalake.ratio",
                "x",
                delta_anchor,
                _paired(theirs_cpu, [r.cpu_ms_per_commit() for r in ours_runs]),
                f"{_topology(store, 8)}; against {_anchor_topology(DELTA, 8)} (its writer "
                f"processes: {statistics.median(theirs_cpu):.2f} ms of CPU a commit); {how}; "
                "deltalake's CPU per commit / percolake's (store, gateway and writer "
                "processes) of paired runs: above 1, percolake spends less CPU a commit",
            )
        )
    if ICEBERG in phase.systems:
        results.append(
            summarize(
                f"lakehouse.appends.deployed.{store}.writers8.vs_iceberg.ratio",
                "x",
                f"{_anchor_topology(ICEBERG, 8)}; same machine, same run",
                _paired(ours8, phase.rates(ICEBERG, 8)),
                f"{_topology(store, 8)}; against {_anchor_topology(ICEBERG, 8)}; {how}; "
                "percolake commits/s / iceberg commits/s of paired runs",
            )
        )
    return results


def _label(phase: Phase, system: str) -> str:
    if system == PERCOLAKE:
        return f"percolake, gateway on {STORE_LABEL[phase.store]}"
    return system


def series(phases: Sequence[Phase], writer_counts: Sequence[int]) -> list[Result]:
    """The growth by writers and the latency distributions at 1 and 8 writers."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for phase in phases:
        for system in phase.systems:
            if system != PERCOLAKE and phase.store != SQLITE:
                continue  # the anchors' own curves come from the SQLite phase
            lines[_label(phase, system)] = [
                (float(w), statistics.median(phase.rates(system, w))) for w in writer_counts
            ]
    results: list[Result] = [
        Growth(
            "lakehouse.appends.deployed.by_writers",
            "One-file appends by concurrent writer processes (percolake through 'percolake serve')",
            "concurrent writer processes",
            "commits/s (median)",
            lines,
            log_y=True,
            note=f"each writer a process with its own handle; percolake: "
            f"TransactionManager.remote + Lakehouse through one 'percolake serve' per store; "
            f"medians of {phases[0].runs} run(s) of {phases[0].seconds:g} s",
        )
    ]
    for writers in (1, 8):
        if writers not in writer_counts:
            continue
        samples: dict[str, list[float]] = {}
        for phase in phases:
            for system in phase.systems:
                if system != PERCOLAKE and phase.store != SQLITE:
                    continue
                ms = [x for r in phase.results[system, writers] for x in r.latencies_ms]
                if ms:
                    samples[_label(phase, system)] = ms
        results.append(
            Latency.of(
                f"lakehouse.appends.deployed.latency.writers{writers}",
                f"One-file append commit latency, {writers} writer process"
                + ("es" if writers > 1 else ""),
                "ms",
                samples,
                note="wall time of every successful commit in each writer process "
                "(Iceberg: with its retries); percolake through 'percolake serve'",
            )
        )
    return results


def run(
    quick: bool,
    progress: Callable[[str], None] = lambda _: None,
    *,
    stores: Sequence[str] | None = None,
    writer_counts: Sequence[int] | None = None,
    runs: int | None = None,
    url: str | None = None,
    seconds: float | None = None,
    warmup_s: float = WARMUP_S,
) -> list[Result]:
    """The suite (``stores``, ``writer_counts`` and ``runs`` narrow or widen it, for the
    command line; ``url``: a running store for the one phase in ``stores``, instead of
    one started for it)."""
    if url and (stores is None or len(stores) != 1 or stores[0] == SQLITE):
        raise ValueError(f"a store URL needs exactly one Cassandra phase, got {stores}")
    counts = tuple(writer_counts or (QUICK_WRITER_COUNTS if quick else WRITER_COUNTS))
    seconds = seconds or (1.0 if quick else 4.0)
    runs = runs or (1 if quick else 2)
    phases_to_run = tuple(stores or ((SQLITE,) if quick else (SQLITE, CASSANDRA1, CASSANDRA3)))
    # Quick mode (inside ``make test``) checks the harness and the contract's figures;
    # Iceberg's side is measured in full runs only.
    anchors = (DELTA,) if quick else (DELTA, ICEBERG)
    phases: list[Phase] = []
    results: list[Result] = []
    progress("lakehouse.appends.deployed: starting writer processes")
    with (
        tempfile.TemporaryDirectory(prefix="percolake-deployed-") as tmp,
        WriterPool(max(counts), (PERCOLAKE, *anchors)) as pool,
    ):
        for store in phases_to_run:
            root = Path(tmp) / store
            root.mkdir()
            systems = (PERCOLAKE, *anchors) if store == SQLITE else (PERCOLAKE, DELTA)
            progress(f"lakehouse.appends.deployed.{store}: starting the store")
            started_store: contextlib.AbstractContextManager[str] = (
                store_url(store, root) if url is None else contextlib.nullcontext(url)
            )
            with started_store as store_at:
                phase = measure_phase(
                    pool, store, store_at, root, counts, systems, seconds, runs, progress, warmup_s
                )
            phases.append(phase)
            results += phase_figures(phase, counts)
    return results + series(phases, counts)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["profile-serve"]:
        # python -m bench.bench_lakehouse_deployed profile-serve OUT.prof serve all ...
        return profiled_serve(Path(args[1]), args[2:])
    from bench.__main__ import describe

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--store", action="append", choices=list(STORE_LABEL))
    parser.add_argument("--writers", type=int, action="append", help="writer processes")
    parser.add_argument("--runs", type=int, help="paired runs per writer count (default 2)")
    parser.add_argument(
        "--url",
        help="cassandra:// URL of a running cluster for the one --store phase (its node "
        "count must match the phase; default: start one)",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="merge the figures into bench/results/latest.json (a run narrowed by --store "
        "or --writers writes its figures only: its curves would replace the full run's)",
    )
    parser.add_argument(
        "--seconds", type=float, help="length of each run (default 4; quick mode 1)"
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=WARMUP_S,
        help="most seconds of warm-up load on a Cassandra store before measuring, until its "
        f"JIT settles (default {WARMUP_S:g}; 0: measure it cold)",
    )
    parsed = parser.parse_args(args)
    if parsed.runs is not None and parsed.runs < 1:
        parser.error(f"--runs must be at least 1, got {parsed.runs}")
    if parsed.warmup_s < 0:
        parser.error(f"--warmup-s must be at least 0, got {parsed.warmup_s:g}")
    if parsed.seconds is not None and parsed.seconds <= 0:
        parser.error(f"--seconds must be above 0, got {parsed.seconds:g}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    results = run(
        parsed.quick,
        progress=lambda n: print("running", n, flush=True),
        stores=parsed.store,
        writer_counts=parsed.writers,
        runs=parsed.runs,
        url=parsed.url,
        seconds=parsed.seconds,
        warmup_s=parsed.warmup_s,
    )
    for result in results:
        print(describe(result))
    print(f"took {time.monotonic() - started:.0f} s")
    if parsed.write:
        from bench._results import write_for_command

        narrowed = parsed.store is not None or parsed.writers is not None
        kept = [r for r in results if isinstance(r, Figure)] if narrowed else results
        print(f"wrote {write_for_command(kept, quick=parsed.quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
