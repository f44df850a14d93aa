"""Hot keys: read-modify-write increments of 4 counters, optimistic and pessimistic
(issue 28).

Workload: each transaction picks one of :data:`KEYS` counters at random, reads it and
writes its value + 1. A client runs transactions back to back until the run's
deadline, each through ``tm.run(fn)`` with the default retry policy (optimistic) or
``tm.run(fn, pessimistic=True)`` (pessimistic: each ``tx.get`` is a
``get_for_update``, which takes the cell's lock in the lock server's queue).

Topology (deployed): one ``percolake serve`` process (oracle, lock server and gateway)
per store, on SQLite (1, 8 and 64 clients) and on a three-node Cassandra 5.0 with
replication factor 3 (1 and 8 clients; full mode only, as the other deployed suites).
Every client is a thread with its own ``TransactionManager.remote``; the threads live
in up to :data:`PROCESSES` client processes (``multiprocessing`` 'spawn', started once
per suite, spawn and import time excluded): 64 clients are 8 processes of 8 threads, 8
clients 8 processes of one, so that 64 Python clients on a 2-core machine are not
one GIL. Each run has a fresh table, so every counter starts at 0.

What a run reports: commits/s (transactions committed before the deadline, divided by
the run's length), p50 and p99 latency of a committed transaction (``tm.run`` from
call to return, retries and backoff included), failed transactions
(:class:`~txn.RetriesExhaustedError`: out of retries) and other errors. A transaction
running at the deadline is let finish (bounded by :data:`STRAGGLER_S`), and after the
run every counter is read back: it must equal the increments its clients saw commit,
exactly (a commit whose outcome was unknown may or may not have landed and widens the
check by one). A mismatch is logged as an error and counted in
``txn.hotkeys.counters_off`` (goal 0). Transactions still retrying at the deadline
meet less contention from then on, so a run's failures are a slight undercount of a
workload that goes on; longer runs (full mode) make that tail a smaller share.

The retry backoff adapts per process (``txn.CONFLICTS``, the share of attempts that
conflicted); each client process resets it at the start of a run, so runs do not
inherit each other's contention, and logs its scale and rate at the end.
``--mode optimistic_fixed`` holds it at scale 1, the fixed window of before issue 28,
for a before/after in one run (not part of the suite's default modes).

``python -m bench --quick --only bench.bench_hotkeys`` runs the suite (quick: SQLite
only, 4 s runs, one run per configuration) and merges its figures into
``bench/results/quick/latest.json``; ``python -m bench.bench_hotkeys --quick`` prints
them (``--write`` merges them too).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from bench._load import end_processes, receive, start_processes
from bench._results import Figure, Latency, MachineLoad, Result, summarize
from bench.bench_lakehouse_deployed import CASSANDRA3, SQLITE, STORE_LABEL, gateway, store_url

log = logging.getLogger(__name__)

OPTIMISTIC, PESSIMISTIC = "optimistic", "pessimistic"
#: Optimistic with the backoff as it was before issue 28 (a fixed window: the client
#: processes' ``txn.CONFLICTS`` held at scale 1), for a before/after in one run; only
#: on request (``--mode optimistic_fixed``).
FIXED = "optimistic_fixed"
MODES = (OPTIMISTIC, PESSIMISTIC)
HOW = {
    OPTIMISTIC: "tm.run(fn), default retry policy (adaptive backoff)",
    PESSIMISTIC: "tm.run(fn, pessimistic=True) (tx.get locks, as get_for_update)",
    FIXED: "tm.run(fn), default retry policy with the backoff held at scale 1 (before)",
}
KEYS = 4
COLUMN = b"n"
CLIENT_COUNTS = {SQLITE: (1, 8, 64), CASSANDRA3: (1, 8)}
#: Client processes at most; a run's clients are spread over them as threads.
PROCESSES = 8
SECONDS, QUICK_SECONDS = 10.0, 4.0
RUNS, QUICK_RUNS = 2, 1
#: A client process's start and open (connect) are bounded.
READY_TIMEOUT_S = 120.0
#: Past the deadline, the longest a transaction already running may take to finish;
#: a client still running then is a failure of the benchmark, not a figure.
STRAGGLER_S = 120.0
#: A client's calls to the gateway are bounded (a lock wait is one call).
CALL_TIMEOUT_S = 30.0

ISSUE_ANCHOR = (
    "issue 28 before the work: SQLite gateway 1 client 254 commits/s, 8 clients 0.75x, "
    "64 clients 0.12x with 112 transactions out of retries; 3-node Cassandra 1 client "
    "73/s, 8 clients 0.54x with 5 out of retries"
)
GOAL_RATIO = "goal (issue 28): 0.8 or more, 0 failed, counters exact"


# --- what a client process does -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    """What one client process runs (sent to it through its pipe)."""

    gateway: str
    table: str
    mode: str
    threads: int
    seconds: float
    seed: int


@dataclass(slots=True)
class ClientRun:
    """One client process's run, sent back to the parent."""

    committed: int = 0  # transactions that returned
    committed_by_deadline: int = 0  # of those, returned before the deadline
    failed: int = 0  # RetriesExhaustedError
    unknown: int = 0  # CommitUnknownError: may or may not have committed
    errors: int = 0  # anything else
    by_key: dict[int, int] = field(default_factory=dict)  # committed increments per key
    unknown_by_key: dict[int, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    first_errors: list[str] = field(default_factory=list)
    #: Each client process's retry backoff scale and conflict rate at the end of the
    #: run (``txn.ConflictRate``; the adaptive backoff).
    backoff: list[tuple[float, float]] = field(default_factory=list)
    #: Transactions by the number of attempts they took (failed ones included).
    attempts: dict[int, int] = field(default_factory=dict)
    #: Seconds from the start of the run to each failure (out of retries).
    failed_at_s: list[float] = field(default_factory=list)

    def add(self, other: ClientRun) -> None:
        self.committed += other.committed
        self.committed_by_deadline += other.committed_by_deadline
        self.failed += other.failed
        self.unknown += other.unknown
        self.errors += other.errors
        for key, n in other.by_key.items():
            self.by_key[key] = self.by_key.get(key, 0) + n
        for key, n in other.unknown_by_key.items():
            self.unknown_by_key[key] = self.unknown_by_key.get(key, 0) + n
        self.latencies_ms.extend(other.latencies_ms)
        self.first_errors.extend(other.first_errors[: max(0, 5 - len(self.first_errors))])
        self.backoff.extend(other.backoff)
        for n, count in other.attempts.items():
            self.attempts[n] = self.attempts.get(n, 0) + count
        self.failed_at_s.extend(other.failed_at_s)


def row(key: int) -> bytes:
    return f"counter-{key}".encode()


def _client_loop(spec: Spec, index: int, start_at: float, out: ClientRun, guard: Any) -> None:
    """One client: its own remote manager, transactions until the deadline."""
    from txn import RetriesExhaustedError, TransactionManager
    from txn.errors import CommitUnknownError

    rng = random.Random(spec.seed * 1000 + index)
    tm = TransactionManager.remote(spec.gateway, timeout_s=CALL_TIMEOUT_S)
    mine = ClientRun()
    stop = start_at + spec.seconds
    try:
        while time.monotonic() < stop:
            key = rng.randrange(KEYS)
            tries = [0]

            def increment(tx: Any, key: int = key, tries: list[int] = tries) -> None:
                tries[0] += 1
                got = tx.get(spec.table, row(key), COLUMN)  # pessimistic: a locked read
                tx.put(spec.table, row(key), COLUMN, str(int(got or b"0") + 1).encode())

            began = time.perf_counter()
            try:
                tm.run(increment, pessimistic=spec.mode == PESSIMISTIC)
            except RetriesExhaustedError:
                mine.failed += 1
                mine.failed_at_s.append(time.monotonic() - start_at)
                continue
            except CommitUnknownError as exc:
                mine.unknown += 1
                mine.unknown_by_key[key] = mine.unknown_by_key.get(key, 0) + 1
                _note(mine, exc)
                continue
            except Exception as exc:
                mine.errors += 1
                _note(mine, exc)
                continue
            finally:
                mine.attempts[tries[0]] = mine.attempts.get(tries[0], 0) + 1
            mine.latencies_ms.append((time.perf_counter() - began) * 1000)
            mine.committed += 1
            mine.by_key[key] = mine.by_key.get(key, 0) + 1
            if time.monotonic() <= stop:
                mine.committed_by_deadline += 1
    finally:
        tm.close()
        with guard:
            out.add(mine)


def _note(run: ClientRun, exc: BaseException) -> None:
    if len(run.first_errors) < 3:
        run.first_errors.append(f"{type(exc).__name__}: {exc}"[:500])


def _backoff() -> tuple[float, float]:
    """This process's retry backoff scale and recent conflict rate."""
    from txn import CONFLICTS

    return CONFLICTS.scale, CONFLICTS.rate


def _fresh_backoff(mode: str) -> None:
    """Each run starts this process's backoff uncontended, so runs do not inherit
    each other's scale; :data:`FIXED` holds it at 1 (the fixed window of before)."""
    from txn import CONFLICTS, ConflictRate

    CONFLICTS.max_scale = 1.0 if mode == FIXED else ConflictRate().max_scale
    CONFLICTS.reset()


def _client_main(conn: Connection, go: Event, start_at: Any) -> None:
    """A client process: import, then serve runs (each a number of threads) until told
    to stop."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import txn  # noqa: F401  (imported before reporting ready: not part of any run)

    conn.send(("hello", os.getpid()))
    while True:
        spec: Spec | None = conn.recv()
        if spec is None:
            return
        try:
            conn.send(("ready", None))
            if not go.wait(READY_TIMEOUT_S):
                conn.send(("error", "never released"))
                continue
            out, guard = ClientRun(), threading.Lock()
            _fresh_backoff(spec.mode)
            begin = float(start_at.value)
            threads = [
                threading.Thread(
                    target=_client_loop, args=(spec, i, begin, out, guard), daemon=True
                )
                for i in range(spec.threads)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(max(0.1, begin + spec.seconds + STRAGGLER_S - time.monotonic()))
            if any(thread.is_alive() for thread in threads):
                conn.send(("error", f"a client thread still running {STRAGGLER_S:.0f} s late"))
                continue
            out.backoff.append(_backoff())
            conn.send(("done", out))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class ClientPool:
    """Client processes started once ('spawn'); stopped on exit, by their own pids."""

    def __init__(self, size: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.go = ctx.Event()
        self.start_at = ctx.RawValue("d", 0.0)
        self.procs, self.conns = start_processes(
            ctx, _client_main, (self.go, self.start_at), size, "bench-hotkeys", READY_TIMEOUT_S
        )

    def _recv(self, i: int, timeout_s: float) -> tuple[str, Any]:
        return receive(self.procs[i], self.conns[i], timeout_s)

    def run(self, specs: Sequence[Spec]) -> tuple[ClientRun, float]:
        """One run, the processes released together; the merged result and its length
        (the deadline, in seconds)."""
        self.go.clear()
        for i, spec in enumerate(specs):
            self.conns[i].send(spec)
        for i in range(len(specs)):
            kind, payload = self._recv(i, READY_TIMEOUT_S)
            if kind != "ready":
                raise RuntimeError(f"client process {i}: {payload}")
        seconds = specs[0].seconds
        self.start_at.value = time.monotonic()
        self.go.set()
        merged = ClientRun()
        problems: list[str] = []
        for i in range(len(specs)):
            kind, payload = self._recv(i, seconds + STRAGGLER_S + READY_TIMEOUT_S)
            if kind == "done":
                merged.add(payload)
            else:
                problems.append(f"client process {i}: {payload}")
        if problems:
            raise RuntimeError("\n".join(problems))
        return merged, seconds

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        end_processes(self.procs, self.conns)

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def layout(clients: int, processes: int = PROCESSES) -> list[int]:
    """Threads per client process for ``clients`` clients: as even as it goes, over at
    most ``processes`` processes (64 -> 8 x 8, 8 -> 8 x 1, 1 -> 1)."""
    if clients < 1:
        raise ValueError(f"clients must be positive, got {clients}")
    used = min(clients, processes)
    return [clients // used + (1 if i < clients % used else 0) for i in range(used)]


# --- one configuration ----------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """One run of ``clients`` clients in one mode, checked."""

    clients: int
    seconds: float
    got: ClientRun
    counters: dict[int, int]
    off: list[str]  # keys whose counter is not what the clients saw commit

    @property
    def rate(self) -> float:
        return self.got.committed_by_deadline / self.seconds

    def percentile_ms(self, p: float) -> float:
        ordered = sorted(self.got.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def check_counters(got: ClientRun, counters: dict[int, int]) -> list[str]:
    """What is wrong with the counters read back: each must equal the increments its
    clients saw commit, up to the ones whose outcome was unknown."""
    off = []
    for key in range(KEYS):
        low = got.by_key.get(key, 0)
        high = low + got.unknown_by_key.get(key, 0)
        value = counters.get(key, 0)
        if not low <= value <= high:
            span = f"{low}" if low == high else f"{low}..{high}"
            off.append(f"counter {key} is {value}, committed increments {span}")
    return off


def read_counters(address: str, table: str) -> dict[int, int]:
    from txn import TransactionManager

    tm = TransactionManager.remote(address, timeout_s=CALL_TIMEOUT_S)
    try:
        with tm.begin() as tx:
            return {key: int(tx.get(table, row(key), COLUMN) or b"0") for key in range(KEYS)}
    finally:
        tm.close()


def measure(
    pool: ClientPool, address: str, table: str, mode: str, clients: int, seconds: float, seed: int
) -> Run:
    specs = [
        Spec(address, table, mode, threads, seconds, seed * PROCESSES + i)
        for i, threads in enumerate(layout(clients))
    ]
    got, length = pool.run(specs)
    counters = read_counters(address, table)
    off = check_counters(got, counters)
    if off:
        log.error("LOST OR EXTRA INCREMENTS in %s, %s, %d clients: %s", table, mode, clients, off)
    if got.errors or got.unknown:
        log.warning(
            "%s %d clients: %d errors, %d unknown outcomes, e.g. %s",
            mode,
            clients,
            got.errors,
            got.unknown,
            got.first_errors[:2],
        )
    return Run(clients, length, got, counters, off)


@dataclass(slots=True)
class Phase:
    store: str
    runs: dict[tuple[str, int], list[Run]] = field(default_factory=dict)


def measure_phase(
    pool: ClientPool,
    store: str,
    url: str,
    root: Path,
    counts: Sequence[int],
    modes: Sequence[str],
    seconds: float,
    runs: int,
    progress: Callable[[str], None],
) -> Phase:
    """Every mode and client count on one gateway over ``url``, ``runs`` times, the
    order of the modes alternated from run to run."""
    phase = Phase(store)
    with gateway(url, root, f"hotkeys-{store}") as gw:
        for run in range(runs):
            for clients in counts:
                order = list(modes) if run % 2 == 0 else list(modes)[::-1]
                for mode in order:
                    progress(f"hotkeys {store} {mode} clients{clients} run {run + 1}/{runs}")
                    table = f"hot_{mode}_{clients}_{run}"
                    got = measure(pool, gw.address, table, mode, clients, seconds, run)
                    phase.runs.setdefault((mode, clients), []).append(got)
                    log.info(
                        "%s %s %d clients: %.1f commits/s, p50 %.1f ms, p99 %.1f ms, %d failed; "
                        "backoff scale and conflict rate by process at the end %s; "
                        "transactions by attempts %s; failures at %s s",
                        store,
                        mode,
                        clients,
                        got.rate,
                        got.percentile_ms(50),
                        got.percentile_ms(99),
                        got.got.failed,
                        [(round(a, 1), round(b, 2)) for a, b in got.got.backoff],
                        dict(sorted(got.got.attempts.items())),
                        [round(t, 1) for t in sorted(got.got.failed_at_s)],
                    )
    return phase


# --- figures ---------------------------------------------------------------------------


def _prefix(store: str, mode: str) -> str:
    return f"txn.hotkeys.{mode}" + ("" if store == SQLITE else f".{store}3")


def _topology(store: str, clients: int) -> str:
    shape = " x ".join(str(n) for n in layout(clients))
    return (
        f"{clients} client(s), each a thread with its own TransactionManager.remote, in "
        f"client processes of [{shape}] threads, read-modify-write +1 of one of {KEYS} "
        f"counters at random, through one 'percolake serve' (oracle, locks, gateway) on "
        f"{STORE_LABEL[store]}, same machine ({os.cpu_count()} CPUs)"
    )


def phase_figures(phase: Phase) -> list[Result]:
    out: list[Result] = []
    modes = sorted({mode for mode, _ in phase.runs})
    for mode in modes:
        prefix = _prefix(phase.store, mode)
        counts = sorted(clients for m, clients in phase.runs if m == mode)
        how = HOW[mode]
        for clients in counts:
            runs = phase.runs[mode, clients]
            name = f"{prefix}.clients{clients}"
            note = f"{_topology(phase.store, clients)}; {how}; {runs[0].seconds:g} s runs"
            failed = [r.got.failed for r in runs]
            out += [
                summarize(
                    f"{name}.commits_per_s",
                    "commits/s",
                    ISSUE_ANCHOR,
                    [r.rate for r in runs],
                    note,
                ),
                summarize(
                    f"{name}.p50_ms", "ms", ISSUE_ANCHOR, [r.percentile_ms(50) for r in runs], note
                ),
                summarize(
                    f"{name}.p99_ms", "ms", ISSUE_ANCHOR, [r.percentile_ms(99) for r in runs], note
                ),
                Figure(
                    f"{name}.failed",
                    float(sum(failed)),
                    "transactions",
                    len(runs),
                    0.0,
                    "goal (issue 28): 0 out of retries",
                    f"{note}; sum over the runs (each: {failed}); transactions "
                    f"{sum(r.got.committed + r.got.failed for r in runs)}; other errors "
                    f"{sum(r.got.errors for r in runs)}, unknown outcomes "
                    f"{sum(r.got.unknown for r in runs)}",
                ),
            ]
        for clients in counts[1:]:
            ours, base = phase.runs[mode, clients], phase.runs[mode, counts[0]]
            ratios = [a.rate / b.rate for a, b in zip(ours, base, strict=False) if b.rate > 0]
            if not ratios:
                continue
            out.append(
                summarize(
                    f"{prefix}.clients{clients}.vs_clients{counts[0]}.ratio",
                    "ratio",
                    f"{GOAL_RATIO}; {ISSUE_ANCHOR}",
                    ratios,
                    f"commits/s with {clients} clients / with {counts[0]}, runs paired; "
                    f"{_topology(phase.store, clients)}; {how}",
                )
            )
    return out


def run(
    quick: bool,
    progress: Callable[[str], None] = lambda _: None,
    *,
    stores: Sequence[str] | None = None,
    modes: Sequence[str] = MODES,
    seconds: float | None = None,
    runs: int | None = None,
    clients: Sequence[int] | None = None,
) -> list[Result]:
    chosen_stores = tuple(stores or ((SQLITE,) if quick else (SQLITE, CASSANDRA3)))
    length = seconds or (QUICK_SECONDS if quick else SECONDS)
    repeats = runs or (QUICK_RUNS if quick else RUNS)
    phases: list[Phase] = []
    machine = MachineLoad()
    with tempfile.TemporaryDirectory(prefix="percolake-hotkeys-") as tmp:
        progress("hotkeys: starting client processes")
        with ClientPool(PROCESSES) as pool:
            for store in chosen_stores:
                root = Path(tmp) / store
                root.mkdir()
                progress(f"hotkeys: {store} store")
                with store_url(store, root) as url:
                    phases.append(
                        measure_phase(
                            pool,
                            store,
                            url,
                            root,
                            tuple(clients or CLIENT_COUNTS[store]),
                            modes,
                            length,
                            repeats,
                            progress,
                        )
                    )
    load = machine.note()
    out: list[Result] = []
    for phase in phases:
        out += [
            Figure(f.name, f.value, f.unit, f.runs, f.spread, f.anchor, f"{f.note}; {load}")
            if isinstance(f, Figure)
            else f
            for f in phase_figures(phase)
        ]
    everything = [r for phase in phases for runs_ in phase.runs.values() for r in runs_]
    off = [f"{r.clients} clients: {o}" for r in everything for o in r.off]
    if off:
        log.error("hot keys: counters not exact: %s", off)
    out.append(
        Figure(
            "txn.hotkeys.counters_off",
            float(len(off)),
            "counters",
            len(everything),
            0.0,
            "goal: 0 (every counter equals the increments its clients saw commit)",
            "; ".join(off[:5]) or "every counter of every run exact",
        )
    )
    samples = {
        f"{phase.store} {mode} {clients} clients": [ms for r in rs for ms in r.got.latencies_ms]
        for phase in phases
        for (mode, clients), rs in phase.runs.items()
    }
    samples = {label: values for label, values in samples.items() if values}
    if samples:
        out.append(
            Latency.of(
                "txn.hotkeys.latency",
                f"Increment of one of {KEYS} hot counters through percolake serve",
                "ms",
                samples,
                f"tm.run from call to return, retries and backoff included; {load}",
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from bench.__main__ import finish_command

    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_hotkeys",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="SQLite only, short runs")
    parser.add_argument("--store", action="append", choices=(SQLITE, CASSANDRA3))
    parser.add_argument("--mode", action="append", choices=(*MODES, FIXED))
    parser.add_argument("--seconds", type=float, help="length of one run")
    parser.add_argument("--runs", type=int, help="runs of each configuration")
    parser.add_argument(
        "--clients", type=int, action="append", help="client counts (default: the store's)"
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
        modes=args.mode or MODES,
        seconds=args.seconds,
        runs=args.runs,
        clients=args.clients,
    )
    return finish_command(results, started=started, write=args.write, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
