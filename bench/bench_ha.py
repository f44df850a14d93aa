"""Availability when the leading replica fails (issue 16, "no single point of failure").

Topology, per store: three ``percolake serve`` processes (role ``all``: oracle, lock
server and gateway each) on one store, replicas of one control plane with the
*default* leader lease (``--leader-lease-ms`` not given: 2000 ms, renewed every
500 ms; a follower takes over after the row stayed unchanged 2.2 s). Four writer
*processes* (``multiprocessing`` 'spawn'), each with its own
``TransactionManager.remote("<all three addresses>")`` (writer ``i`` lists them
rotated by ``i``, so the writers start on different gateways), commit small
transactions back to back: writer ``i`` rewrites its own cell (``ha``/``w<i>``/``c``),
one 8-byte value per transaction, so writers never conflict. Each writer records
``(start, end, ok)`` of every commit with ``time.monotonic()`` (one clock for every
process on Linux) and sleeps 10 ms after a failed one.

After a warm-up the benchmark finds the leader in the store's leader row
(``_leader``/``tso``, :class:`tso._lease.LeaseRecord`) and injects a fault on it:

* ``leader_kill``: SIGKILL; once every writer committed again it is restarted on the
  same port (a follower now);
* ``leader_pause``: SIGSTOP for three leases (6 s, longer than the lease), then
  SIGCONT; if another replica took over meanwhile, the woken one's next round finds the
  row changed and it stops leading (on SQLite, a leader stopped inside a write
  transaction keeps the file's write lock, and nobody takes over before it resumes).

Then it lets the replicas settle (every writer commits again after the restart or
SIGCONT, and a few seconds pass) before the next fault, so each fault hits the leader
of the moment and the leaders rotate. Ten faults of each kind (quick mode: one),
alternating: how long a pause costs depends on what the leader was doing when it stopped
(see the pause figure's note), so five faults were too few for a stable median.

The **outage** a writer sees is the time from the fault (the instant before the
signal) until the end of its first commit that started at or after the fault and
succeeded: commits in flight at the fault do not count either way. The outage of a
fault is the worst writer's (``*.outage_s``, the median over the faults;
``*.outage_max_s``, the largest); ``*.outage_writer_median_s`` is the median writer's.
``*.takeover_s`` is the time until the leader row names a new live leader (read every
50 ms by the benchmark), the part of the outage the lease accounts for;
``*.commit_p50_ms`` what one commit takes away from the faults, for scale.
``--workdir`` keeps the stores, the replicas' logs and every commit record
(``<store>/ha-records.json``).

The figures without a store in their name (``ha.leader_kill.*``, ``ha.leader_pause.*``)
are on SQLite (one file in a temporary folder); ``ha.cassandra.*`` on a three-node
Cassandra 5.0 cluster with replication factor 3 (full mode only).

``python -m bench --only bench.bench_ha`` runs the suite and merges its figures into
``bench/results/latest.json``; so does ``python -m bench.bench_ha --write``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._load import end_processes
from bench._results import Figure, Result, summarize
from tso import DEFAULT_LEASE_MS, DRIFT_MARGIN, LEADER_TABLE, LeaseRecord

if TYPE_CHECKING:
    from storage_adapters import KVStore
    from tests.servers import ServerProcess

log = logging.getLogger(__name__)

SQLITE, CASSANDRA = "sqlite", "cassandra"
STORE_LABEL = {
    SQLITE: "SQLite (one file in a temporary folder)",
    CASSANDRA: "Cassandra 5.0, three nodes, replication factor 3",
}
#: Figure-name prefix per store: the contract's names are the SQLite ones.
PREFIX = {SQLITE: "ha", CASSANDRA: "ha.cassandra"}
KILL, PAUSE = "leader_kill", "leader_pause"

REPLICAS = 3
WRITERS = 4
REPETITIONS = 10
QUICK_REPETITIONS = 1
#: The lease every replica runs with: the default, as ``percolake serve`` starts.
LEASE_S = DEFAULT_LEASE_MS / 1000
#: A pause lasts this many leases: longer than the lease, so another replica takes over.
PAUSE_LEASES = 3
#: Commits before the first fault, and after each recovery before the next fault.
WARMUP_S, QUICK_WARMUP_S = 3.0, 1.5
SETTLE_S, QUICK_SETTLE_S = 3.0, 1.0
#: A fault whose writers have not all committed again by then is given up on (and
#: counted as an outage this long).
RECOVERY_TIMEOUT_S = 60.0
#: How often the benchmark reads the leader row and the writers' progress.
POLL_S = 0.05
#: A writer's pause after a failed commit, so a dead gateway is not spun on.
FAILURE_BACKOFF_S = 0.01
#: The client's deadline on one call; calls waiting for a new leader stay well below.
CLIENT_TIMEOUT_S = 30.0
#: Bounds on starting the writers and on collecting their records.
READY_TIMEOUT_S = 120.0
COLLECT_TIMEOUT_S = 120.0
#: A writer stops by itself after this long, whatever the benchmark does.
WRITER_MAX_S = 3 * 3600.0
#: The issue's goal for either fault, with default settings.
GOAL_S = 5.0
TABLE = "ha"

#: One commit as a writer saw it: (start, end, ok), ``time.monotonic()`` seconds.
Record = tuple[float, float, bool]


# --- the outage of one fault (pure) ------------------------------------------------------


def writer_outage_s(records: Sequence[Record], fault_at: float, until: float) -> float | None:
    """Seconds from ``fault_at`` until the end of the writer's first commit that started
    at or after it, before ``until``, and succeeded; None if there is none (the writer
    did not recover in the window).

    A commit already running at the fault does not count, even when it succeeds: it
    may have got its timestamps and locks before the fault.
    """
    ends = [end for start, end, ok in records if ok and fault_at <= start and end <= until]
    return min(ends) - fault_at if ends else None


@dataclass(frozen=True, slots=True)
class FaultOutage:
    """What every writer saw of one fault."""

    kind: str
    fault_at: float
    window_s: float
    #: Each writer's outage; None: it did not recover within the window.
    per_writer: tuple[float | None, ...]
    #: Commits that failed in the window, over all writers.
    failed: int

    @property
    def recovered(self) -> bool:
        return all(s is not None for s in self.per_writer)

    def _counted(self) -> list[float]:
        """Each writer's outage, a writer that never recovered counted as the window."""
        return [self.window_s if s is None else s for s in self.per_writer]

    @property
    def max_s(self) -> float:
        """The worst writer's outage: when every writer commits again."""
        return max(self._counted())

    @property
    def median_s(self) -> float:
        return statistics.median(self._counted())


def fault_outage(
    kind: str, records: Sequence[Sequence[Record]], fault_at: float, until: float
) -> FaultOutage:
    """The outage of a fault at ``fault_at`` in each writer's ``records``, looking no
    further than ``until`` (the next fault, or the end of the run)."""
    if not records:
        raise ValueError("no writers")
    if until <= fault_at:
        raise ValueError(f"empty window: fault at {fault_at}, until {until}")
    failed = sum(
        1 for rs in records for start, end, ok in rs if not ok and fault_at <= end <= until
    )
    return FaultOutage(
        kind,
        fault_at,
        until - fault_at,
        tuple(writer_outage_s(rs, fault_at, until) for rs in records),
        failed,
    )


# --- the writer processes ----------------------------------------------------------------


def _rotated(items: Sequence[str], by: int) -> list[str]:
    k = by % len(items)
    return [*items[k:], *items[:k]]


@dataclass(slots=True)
class WriterLog:
    """One writer's commits, sent back to the benchmark at the end of a phase."""

    records: list[Record] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)


def _writer_main(
    conn: Connection, index: int, addresses: str, stop: Event, last_ok: Any, max_s: float
) -> None:
    """A writer process: commit to its own cell until ``stop``; record every commit."""
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    from txn import TransactionManager

    out = WriterLog()
    try:
        tm = TransactionManager.remote(addresses, timeout_s=CLIENT_TIMEOUT_S)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("hello", None))
    row = b"w%d" % index
    deadline = time.monotonic() + max_s
    n = 0
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            n += 1
            start = time.monotonic()
            try:
                with tm.begin() as tx:
                    tx.put(TABLE, row, b"c", n.to_bytes(8, "big"))
            except Exception as error:
                out.records.append((start, time.monotonic(), False))
                out.errors[type(error).__name__] += 1
                if len(out.examples) < 3:
                    out.examples.append(f"{type(error).__name__}: {error}"[:300])
                stop.wait(FAILURE_BACKOFF_S)
                continue
            out.records.append((start, time.monotonic(), True))
            last_ok[index] = start
    finally:
        tm.close()
        conn.send(("done", out))


class Writers:
    """The writer processes of one phase, committing from the moment they start; stopped
    on exit, by their own pids."""

    def __init__(self, addresses: Sequence[str], count: int = WRITERS) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        #: The start time of each writer's latest successful commit.
        self.last_ok: Any = ctx.RawArray("d", count)
        self.conns: list[Connection] = []
        self.procs: list[SpawnProcess] = []
        try:
            self._start(ctx, addresses, count)
        except BaseException:
            self.close()
            raise

    def _start(self, ctx: Any, addresses: Sequence[str], count: int) -> None:
        for i in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_writer_main,
                args=(child, i, ",".join(_rotated(addresses, i)), self.stop, self.last_ok),
                kwargs={"max_s": WRITER_MAX_S},
                name=f"bench-ha-writer-{i}",
                daemon=True,
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for i, conn in enumerate(self.conns):
            if not conn.poll(READY_TIMEOUT_S):
                raise TimeoutError(f"writer {i} (pid {self.procs[i].pid}) did not start")
            kind, payload = conn.recv()
            if kind != "hello":
                raise RuntimeError(f"writer {i} did not start: {payload}")

    def all_committed_since(self, t: float) -> bool:
        """Whether every writer has a successful commit that started at or after ``t``."""
        return all(self.last_ok[i] >= t for i in range(len(self.procs)))

    def wait_all_committed_since(self, t: float, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.all_committed_since(t):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def collect(self) -> list[WriterLog]:
        """Stop every writer and return its log."""
        self.stop.set()
        logs: list[WriterLog] = []
        for i, conn in enumerate(self.conns):
            if not conn.poll(COLLECT_TIMEOUT_S):
                raise TimeoutError(f"writer {i} (pid {self.procs[i].pid}) did not stop")
            kind, payload = conn.recv()
            if kind != "done":
                raise RuntimeError(f"writer {i}: {payload}")
            logs.append(payload)
        return logs

    def close(self) -> None:
        self.stop.set()
        end_processes(self.procs, self.conns)

    def __enter__(self) -> Writers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the replicas ------------------------------------------------------------------------


class Replicas:
    """``REPLICAS`` ``percolake serve`` processes on one store, default lease."""

    def __init__(self, url: str, workdir: Path, count: int = REPLICAS) -> None:
        from tests.servers import ServerProcess

        self.servers: list[ServerProcess] = []
        try:
            for _ in range(count):
                self.servers.append(ServerProcess("all", ["--store", url], workdir).start())
        except BaseException:
            self.close()
            raise

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def index_of(self, address: str) -> int:
        return self.addresses.index(address)

    def close(self) -> None:
        for server in self.servers:
            server.signal(signal.SIGCONT)  # a paused one could not stop gracefully
            code = server.stop()
            if code not in (0, None, -signal.SIGKILL):
                log.warning("replica exited %s: %s", code, server.output()[-1500:])

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_leader(store: KVStore) -> LeaseRecord | None:
    """The leader row of the oracle's role, as the store holds it now."""
    raw = store.get_system(LEADER_TABLE, [b"tso"]).get(b"tso")
    return None if raw is None else LeaseRecord.decode(raw)


def _wait_for_leader(store: KVStore, addresses: Sequence[str], timeout_s: float) -> LeaseRecord:
    deadline = time.monotonic() + timeout_s
    while True:
        record = read_leader(store)
        if record is not None and record.live and record.address in addresses:
            return record
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no live leader among {list(addresses)}: {record}")
        time.sleep(POLL_S)


# --- one fault -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault, as the benchmark saw it."""

    kind: str
    fault_at: float
    #: Which replica (index in start order) led and was hit, and which led after.
    victim: int
    successor: int | None
    #: Seconds until the leader row named another live leader (None: not in time).
    takeover_s: float | None
    #: When the victim was restarted or woken (SIGCONT).
    resumed_at: float


def inject(
    kind: str, replicas: Replicas, store: KVStore, writers: Writers, settle_s: float
) -> Fault:
    """Hit the leader with ``kind``, wait for every writer to commit again, bring the
    victim back, and let things settle."""
    record = _wait_for_leader(store, replicas.addresses, RECOVERY_TIMEOUT_S)
    victim = replicas.index_of(record.address)
    server = replicas.servers[victim]
    port = server.port
    pause_s = PAUSE_LEASES * LEASE_S
    fault_at = time.monotonic()
    server.signal(signal.SIGKILL if kind == KILL else signal.SIGSTOP)
    takeover_s: float | None = None
    successor: int | None = None
    resumed_at: float | None = None
    deadline = fault_at + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        now = time.monotonic()
        if takeover_s is None:
            current = read_leader(store)
            if (
                current is not None
                and current.live
                and current.epoch > record.epoch
                and current.address != record.address
            ):
                takeover_s = time.monotonic() - fault_at
                if current.address in replicas.addresses:
                    successor = replicas.index_of(current.address)
        if kind == PAUSE and resumed_at is None and now >= fault_at + pause_s:
            server.signal(signal.SIGCONT)
            resumed_at = time.monotonic()
        # A paused leader woken before anyone took over simply leads on: recovered too.
        back = kind == KILL or resumed_at is not None
        if back and writers.all_committed_since(fault_at):
            break
        time.sleep(POLL_S)
    else:
        log.warning(
            "%s of replica %d: writers not all committing after %.0f s",
            kind,
            victim,
            RECOVERY_TIMEOUT_S,
        )
    if takeover_s is None:  # it may have come between the last read and the break
        current = read_leader(store)
        if current is not None and current.live and current.epoch > record.epoch:
            takeover_s = time.monotonic() - fault_at
            if current.address in replicas.addresses:
                successor = replicas.index_of(current.address)
    if kind == KILL:
        server.kill()  # reap it
        server.start(port)  # the same address: clients list it
        resumed_at = time.monotonic()
    elif resumed_at is None:
        server.signal(signal.SIGCONT)
        resumed_at = time.monotonic()
    time.sleep(settle_s)
    if not writers.wait_all_committed_since(resumed_at, RECOVERY_TIMEOUT_S):
        log.warning(
            "writers not all committing %.0f s after the %s ended", RECOVERY_TIMEOUT_S, kind
        )
    return Fault(kind, fault_at, victim, successor, takeover_s, resumed_at)


# --- one phase: a store, its replicas, every fault -----------------------------------------


@dataclass(slots=True)
class Phase:
    store: str
    repetitions: int
    faults: list[Fault] = field(default_factory=list)
    logs: list[WriterLog] = field(default_factory=list)
    ended_at: float = 0.0

    def outages(self, kind: str) -> list[FaultOutage]:
        """The outage of every fault of ``kind``, each looked at until the next fault."""
        ends = [f.fault_at for f in self.faults[1:]] + [self.ended_at]
        records = [w.records for w in self.logs]
        return [
            fault_outage(f.kind, records, f.fault_at, min(until, f.fault_at + RECOVERY_TIMEOUT_S))
            for f, until in zip(self.faults, ends, strict=True)
            if f.kind == kind
        ]

    def commits(self) -> tuple[int, int]:
        """(succeeded, failed) over the whole phase."""
        ok = sum(1 for w in self.logs for r in w.records if r[2])
        return ok, sum(len(w.records) for w in self.logs) - ok

    def quiet_latencies_s(self) -> list[float]:
        """How long successful commits took away from the faults: those that overlap no
        fault's outage (from the fault until its last writer committed again)."""
        outages = sorted(
            (o.fault_at, o.fault_at + o.max_s) for kind in (KILL, PAUSE) for o in self.outages(kind)
        )
        return [
            end - start
            for w in self.logs
            for start, end, ok in w.records
            if ok and not any(start < until and end > at for at, until in outages)
        ]

    def dump(self, path: Path) -> None:
        """The faults and every writer's records, as JSON, for a closer look."""
        path.write_text(
            json.dumps(
                {
                    "store": self.store,
                    "ended_at": self.ended_at,
                    "faults": [asdict(f) for f in self.faults],
                    "writers": [
                        {"records": w.records, "errors": dict(w.errors), "examples": w.examples}
                        for w in self.logs
                    ],
                }
            )
        )


def measure_phase(
    store_name: str,
    url: str,
    root: Path,
    repetitions: int,
    warmup_s: float,
    settle_s: float,
    progress: Callable[[str], None],
) -> Phase:
    from storage_adapters import open_store

    phase = Phase(store_name, repetitions)
    progress(f"ha.{store_name}: starting {REPLICAS} replicas")
    store = open_store(url)
    try:
        with Replicas(url, root) as replicas:
            _wait_for_leader(store, replicas.addresses, RECOVERY_TIMEOUT_S)
            progress(f"ha.{store_name}: starting {WRITERS} writer processes")
            with Writers(replicas.addresses) as writers:
                began = time.monotonic()
                if not writers.wait_all_committed_since(began, RECOVERY_TIMEOUT_S):
                    raise RuntimeError("the writers do not commit before any fault")
                time.sleep(warmup_s)
                for rep in range(repetitions):
                    for kind in (KILL, PAUSE) if rep % 2 == 0 else (PAUSE, KILL):
                        progress(f"ha.{store_name}.{kind} {rep + 1}/{repetitions}")
                        fault = inject(kind, replicas, store, writers, settle_s)
                        phase.faults.append(fault)
                        log.info("%s: %s", store_name, fault)
                phase.ended_at = time.monotonic()
                phase.logs = writers.collect()
        phase.dump(root / "ha-records.json")
    finally:
        store.close()
    return phase


# --- figures -----------------------------------------------------------------------------


def _topology(store: str) -> str:
    return (
        f"{REPLICAS} 'percolake serve' replicas (role all) on {STORE_LABEL[store]}, default "
        f"leader lease {DEFAULT_LEASE_MS} ms; {WRITERS} writer processes, each "
        "TransactionManager.remote(<all three addresses>, rotated per writer) committing "
        "one-cell transactions to its own cell back to back; same machine"
    )


ANCHOR = (
    f"goal of issue 16: commits succeed again within {GOAL_S:g} s of losing the leader, "
    f"default settings; the lease alone costs {LEASE_S * (1 + DRIFT_MARGIN):g} s "
    "(lease x 1.1) after the dead leader's last renewal"
)


def phase_figures(phase: Phase) -> list[Figure]:
    prefix = PREFIX[phase.store]
    ok, failed = phase.commits()
    errors: Counter[str] = Counter()
    for w in phase.logs:
        errors.update(w.errors)
    figures: list[Figure] = []
    for kind in (KILL, PAUSE):
        outages = phase.outages(kind)
        faults = [f for f in phase.faults if f.kind == kind]
        if not outages:
            continue
        what = (
            "kill -9 of the leading replica, restarted on its port once every writer "
            "committed again"
            if kind == KILL
            else f"SIGSTOP of the leading replica for {PAUSE_LEASES * LEASE_S:g} s "
            f"({PAUSE_LEASES} leases), then SIGCONT"
        )
        not_recovered = sum(1 for o in outages if not o.recovered)
        victims = ", ".join(
            f"r{f.victim}->" + ("?" if f.successor is None else f"r{f.successor}") for f in faults
        )
        how = (
            f"{_topology(phase.store)}; fault: {what}; {len(outages)} fault(s), alternating "
            f"with the other kind, each on the leader of the moment (replicas {victims}); "
            "outage of a writer = from the signal to the end of its first successful commit "
            "that started after it"
            + (
                f"; {not_recovered} fault(s) not recovered within "
                f"{RECOVERY_TIMEOUT_S:g} s, counted as that"
                if not_recovered
                else ""
            )
        )
        worst = [o.max_s for o in outages]
        each = ", ".join(f"{w:.2f}" for w in worst)
        taken = sum(
            1
            for f in faults
            if f.takeover_s is not None and f.fault_at + f.takeover_s < f.resumed_at
        )
        takeovers_note = (
            f"; another replica took over during the pause in {taken} of {len(faults)}"
            + (
                " (a pause that catches the leader inside a SQLite write transaction holds "
                "the file's write lock, which every other replica's writes wait for, the "
                "takeover's compare-and-set included, until SIGCONT)"
                if phase.store == SQLITE and taken < len(faults)
                else ""
            )
            if kind == PAUSE
            else ""
        )
        figures.append(
            summarize(
                f"{prefix}.{kind}.outage_s",
                "s",
                ANCHOR,
                worst,
                f"{how}; the worst of the {WRITERS} writers per fault ({each} s), median over "
                f"faults{takeovers_note}",
            )
        )
        figures.append(
            Figure(
                f"{prefix}.{kind}.outage_max_s",
                round(max(worst), 3),
                "s",
                len(worst),
                summarize("max", "s", ANCHOR, worst).spread,
                ANCHOR,
                f"{how}; the worst of the {WRITERS} writers per fault, the largest over faults",
            )
        )
        figures.append(
            summarize(
                f"{prefix}.{kind}.outage_writer_median_s",
                "s",
                ANCHOR,
                [o.median_s for o in outages],
                f"{how}; the median of the {WRITERS} writers per fault, median over faults",
            )
        )
        takeovers = [f.takeover_s for f in faults if f.takeover_s is not None]
        if takeovers:
            figures.append(
                summarize(
                    f"{prefix}.{kind}.takeover_s",
                    "s",
                    f"the lease protocol: a follower waits {LEASE_S * (1 + DRIFT_MARGIN):g} s "
                    "(lease x 1.1) from when it first saw the last renewal, which the dead "
                    f"leader sent up to {LEASE_S / 4:g} s (lease / 4) before the fault",
                    takeovers,
                    f"{how}; from the signal until the leader row (read every "
                    f"{POLL_S * 1000:g} ms) names another live leader, median over faults"
                    + (
                        f"; {len(faults) - len(takeovers)} fault(s) without a takeover"
                        if len(takeovers) < len(faults)
                        else ""
                    ),
                )
            )
        figures.append(
            Figure(
                f"{prefix}.{kind}.failed_commits",
                float(sum(o.failed for o in outages)),
                "commits",
                len(outages),
                0.0,
                ANCHOR,
                f"{how}; commits that raised between a fault and the next (total over faults "
                f"and writers); the whole run: {ok} commits succeeded, {failed} failed"
                + (
                    f" ({', '.join(f'{k} {v}' for k, v in errors.most_common())})" if errors else ""
                ),
            )
        )
    quiet = phase.quiet_latencies_s()
    if quiet:
        figures.append(
            summarize(
                f"{prefix}.commit_p50_ms",
                "ms",
                "the same writers' commits during the faults' outages (the figures above)",
                [1000 * statistics.median(quiet)],
                f"{_topology(phase.store)}; median time of the {len(quiet)} successful "
                "commits that overlap no fault's outage (from a fault until its last writer "
                "committed again): what one commit costs here when nothing fails",
            )
        )
    return figures


# --- the suite ---------------------------------------------------------------------------


@contextmanager
def _store(store: str, root: Path) -> Iterator[str]:
    from bench.bench_lakehouse_deployed import CASSANDRA3, store_url

    # The deployed-topology suite's stores: SQLite is named alike; its three-node cluster.
    with store_url(SQLITE if store == SQLITE else CASSANDRA3, root) as url:
        yield url


def run(
    quick: bool,
    progress: Callable[[str], None] = lambda _: None,
    *,
    stores: Sequence[str] | None = None,
    repetitions: int | None = None,
    workdir: Path | None = None,
) -> list[Result]:
    """The suite (``stores`` and ``repetitions`` narrow it, for the command line;
    ``workdir`` keeps the stores and the replicas' logs)."""
    reps = repetitions or (QUICK_REPETITIONS if quick else REPETITIONS)
    warmup_s, settle_s = (QUICK_WARMUP_S, QUICK_SETTLE_S) if quick else (WARMUP_S, SETTLE_S)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="percolake-ha-") as tmp:
        for store in stores or ((SQLITE,) if quick else (SQLITE, CASSANDRA)):
            root = (workdir or Path(tmp)) / store
            root.mkdir(parents=True)
            progress(f"ha.{store}: starting the store")
            with _store(store, root) as url:
                phase = measure_phase(store, url, root, reps, warmup_s, settle_s, progress)
            results += phase_figures(phase)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    from bench.__main__ import finish_command

    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_ha",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_REPETITIONS} fault of each kind, SQLite"
    )
    parser.add_argument("--store", action="append", choices=[SQLITE, CASSANDRA])
    parser.add_argument(
        "--repetitions", type=int, help=f"faults of each kind (default {REPETITIONS})"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the stores and the replicas' logs here (a new folder; default: a "
        "temporary one, removed)",
    )
    parser.add_argument(
        "--write", action="store_true", help="merge the figures into bench/results/latest.json"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    results = run(
        args.quick,
        progress=lambda step: print(f"   {step} ...", file=sys.stderr, flush=True),
        stores=args.store,
        repetitions=args.repetitions,
        workdir=args.workdir,
    )
    return finish_command(results, started=started, write=args.write, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
