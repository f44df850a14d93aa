"""How fast the only ``percolake serve`` commits again after it starts (issue 30, item 10).

Topology: one ``percolake serve`` process (role ``all``: oracle, lock server and gateway)
on a SQLite store in a temporary folder, started as an operator starts it
(``python -m percolake serve --store sqlite:///... --listen 127.0.0.1:PORT``), default
leader lease (2 s). A probe in this process commits one small transaction through
``TransactionManager.remote``, and again until one succeeds; each attempt is a fresh
manager (a fresh gRPC channel), so that the figure is the server's and not gRPC's
reconnect backoff (a channel that found the port closed waits up to a second before it
tries again). The probe first waits for the port to accept connections (polled every
5 ms), then commits.

Each repetition measures, in order, on one store:

* ``serve.cold_start.first_commit_s``: from the start of the process on a new store
  until the end of the first commit that succeeded;
* ``serve.restart_after_kill.first_commit_s``: after a few commits, ``kill -9`` of the
  process; from the restart (same store, same port) until the first commit. The dead
  leader's row is still held; the restarted replica takes over at once because the
  SQLite claim the dead one held is free (it proves the holder gone), instead of
  waiting out the lease (2.2 s);
* ``serve.restart_after_term.first_commit_s``: the same after SIGTERM (a graceful stop
  releases the row).

Each figure is the median over the repetitions (10; quick mode 3); the goal is 1 s or
less for the first two. ``python -m bench --only bench.bench_restart`` runs the suite
and merges its figures into ``bench/results/latest.json``; so does
``python -m bench.bench_restart --write``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench._results import MachineLoad, Result, summarize
from percolake.tools.ports import free_ports
from txn import TransactionManager

log = logging.getLogger(__name__)

REPETITIONS = 10
QUICK_REPETITIONS = 3
#: Commits between the cold start and the kill, so the store has been written.
COMMITS_BEFORE_KILL = 3
#: A start that has not committed by then is a failure of the benchmark, not a figure.
FIRST_COMMIT_TIMEOUT_S = 60.0
PORT_POLL_S = 0.005
RETRY_PAUSE_S = 0.01
#: The probe's deadline on one call: calls to a gateway still electing its leader wait
#: for it inside the gateway.
CALL_TIMEOUT_S = 20.0
GOAL_S = 1.0
ANCHOR = (
    f"goal: {GOAL_S:g} s or less (issue 30); before the fix a restart after kill -9 waited "
    "out the dead leader's lease, 2.8-3.2 s"
)
COLD, KILL, TERM = "cold_start", "restart_after_kill", "restart_after_term"


def _start(db: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "percolake",
                "serve",
                "--store",
                f"sqlite:///{db}",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env={k: v for k, v in os.environ.items() if k != "PERCOLAKE_TOKEN"},
        )


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _commit_once(address: str) -> None:
    manager = TransactionManager.remote(address, timeout_s=CALL_TIMEOUT_S)
    try:
        with manager.begin() as tx:
            tx.put("restart", b"probe", b"c", str(time.monotonic_ns()).encode())
    finally:
        manager.close()


def first_commit_s(proc: subprocess.Popen[bytes], port: int, started: float) -> float:
    """Seconds from ``started`` until the end of the first commit that succeeded."""
    deadline = started + FIRST_COMMIT_TIMEOUT_S
    address = f"127.0.0.1:{port}"
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"percolake serve exited with {proc.returncode} before serving")
        if not _port_open(port):
            time.sleep(PORT_POLL_S)
            continue
        try:
            _commit_once(address)
        except Exception as exc:  # not serving yet: try again with a fresh channel
            last = exc
            time.sleep(RETRY_PAUSE_S)
            continue
        return time.monotonic() - started
    raise RuntimeError(f"no commit within {FIRST_COMMIT_TIMEOUT_S:.0f} s (last error: {last})")


def _stop(proc: subprocess.Popen[bytes], signum: int) -> None:
    if proc.poll() is None:
        proc.send_signal(signum)
    proc.wait(timeout=60)


def measure_once(root: Path) -> dict[str, float]:
    """One repetition on a new store in ``root``: the three figures' values."""
    db, port, log_path = root / "store.db", free_ports(1)[0], root / "serve.log"
    got: dict[str, float] = {}
    started = time.monotonic()
    proc = _start(db, port, log_path)
    try:
        got[COLD] = first_commit_s(proc, port, started)
        for _ in range(COMMITS_BEFORE_KILL):
            _commit_once(f"127.0.0.1:{port}")
        _stop(proc, signal.SIGKILL)
        started = time.monotonic()
        proc = _start(db, port, log_path)
        got[KILL] = first_commit_s(proc, port, started)
        _stop(proc, signal.SIGTERM)
        started = time.monotonic()
        proc = _start(db, port, log_path)
        got[TERM] = first_commit_s(proc, port, started)
    finally:
        _stop(proc, signal.SIGKILL)
    return got


def run(
    quick: bool,
    progress: Callable[[str], None] = lambda _: None,
    *,
    repetitions: int | None = None,
) -> list[Result]:
    reps = repetitions or (QUICK_REPETITIONS if quick else REPETITIONS)
    values: dict[str, list[float]] = {COLD: [], KILL: [], TERM: []}
    machine = MachineLoad()
    with tempfile.TemporaryDirectory(prefix="percolake-restart-") as tmp:
        for rep in range(reps):
            progress(f"restart {rep + 1}/{reps}")
            root = Path(tmp) / f"rep{rep}"
            root.mkdir()
            for name, value in measure_once(root).items():
                values[name].append(value)
            log.info("repetition %d: %s", rep, {k: round(v[-1], 3) for k, v in values.items()})
    how = (
        "one `percolake serve` on SQLite, default 2 s lease; a probe commits through a "
        "fresh TransactionManager.remote per attempt once the port accepts connections; "
        f"{os.cpu_count()} CPUs, {machine.note()} (a loaded machine starts Python slower)"
    )
    return [
        summarize(
            "serve.cold_start.first_commit_s",
            "s",
            ANCHOR,
            values[COLD],
            f"{how}; from the start of the process on a new store",
        ),
        summarize(
            "serve.restart_after_kill.first_commit_s",
            "s",
            ANCHOR,
            values[KILL],
            f"{how}; from the restart after kill -9 (the dead leader's row still held)",
        ),
        summarize(
            "serve.restart_after_term.first_commit_s",
            "s",
            "for scale: a graceful stop releases the leader row",
            values[TERM],
            f"{how}; from the restart after SIGTERM",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    from bench.__main__ import finish_command

    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_restart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REPETITIONS} repetitions")
    parser.add_argument("--repetitions", type=int, help=f"repetitions (default {REPETITIONS})")
    parser.add_argument(
        "--write", action="store_true", help="merge the figures into bench/results/latest.json"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    results = run(
        args.quick,
        progress=lambda step: print(f"   {step} ...", file=sys.stderr, flush=True),
        repetitions=args.repetitions,
    )
    return finish_command(results, started=started, write=args.write, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
