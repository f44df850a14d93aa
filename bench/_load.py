"""Load loops shared by the benchmarks: threads calling an operation until a deadline,
and the end of the client processes that run them; and a suite run in its own process
(``python -m bench`` runs each so; here, not in ``bench/__main__.py``, because a spawned
child cannot import a package's ``__main__``)."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.process import BaseProcess
from typing import Any

from bench._results import Result

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Run:
    rate: float  # successful calls per second
    failed: int  # calls that raised
    latencies_ms: list[float] = field(default_factory=list)  # successful calls only


def run_threads(
    op: Callable[[int], object],
    threads: int,
    seconds: float,
    open_handle: Callable[[], None] | None = None,
) -> Run:
    """``threads`` threads calling ``op(n)`` (``n`` counts up across them) for
    ``seconds``, from the moment all have run ``open_handle`` (each its own handle,
    before the clock starts); the rate counts until the last call returned. A call
    that raises is counted as failed, not in the rate or the latencies."""
    counter = itertools.count()
    done = [0] * threads
    failed = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    started: list[float] = []
    barrier = threading.Barrier(threads, action=lambda: started.append(time.monotonic()))

    def worker(slot: int) -> None:
        try:
            if open_handle is not None:
                open_handle()
        except BaseException:
            barrier.abort()
            raise
        try:
            barrier.wait(timeout=120)
        except threading.BrokenBarrierError:
            return
        stop = started[0] + seconds
        while time.monotonic() < stop:
            n = next(counter)
            began = time.perf_counter()
            try:
                op(n)
            except Exception:
                log.debug("call %d failed", n, exc_info=True)
                failed[slot] += 1
                continue
            latencies[slot].append((time.perf_counter() - began) * 1000)
            done[slot] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if not started:
        raise RuntimeError("the writers never started: opening a table handle failed")
    elapsed = time.monotonic() - started[0]
    return Run(sum(done) / elapsed, sum(failed), [ms for slot in latencies for ms in slot])


def end_processes(
    procs: Sequence[SpawnProcess], conns: Sequence[Connection], within_s: float = 30.0
) -> None:
    """Join a benchmark's client processes (told to stop by the caller), killing any
    still running after ``within_s`` (our own children, by pid), then close their pipes."""
    deadline = time.monotonic() + within_s
    for proc in procs:
        proc.join(max(0.1, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    for conn in conns:
        conn.close()


def start_processes(
    ctx: SpawnContext,
    target: Callable[..., None],
    args: tuple[Any, ...],
    size: int,
    name: str,
    ready_timeout_s: float,
) -> tuple[list[SpawnProcess], list[Connection]]:
    """Start ``size`` client processes running ``target(conn, *args)``, each with a pipe,
    and wait for each one's ``("hello", ...)``; on any failure, end those started."""
    procs: list[SpawnProcess] = []
    conns: list[Connection] = []
    try:
        for i in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(child, *args), name=f"{name}-{i}", daemon=True)
            proc.start()
            child.close()
            conns.append(parent)
            procs.append(proc)
        for proc, conn in zip(procs, conns, strict=True):
            kind, _ = receive(proc, conn, ready_timeout_s)
            if kind != "hello":
                raise RuntimeError(f"{proc.name} did not start: {kind}")
    except BaseException:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        end_processes(procs, conns)
        raise
    return procs, conns


def receive(proc: SpawnProcess, conn: Connection, timeout_s: float) -> tuple[str, Any]:
    """The next ``(kind, payload)`` a client process sends, waiting at most ``timeout_s``."""
    if not conn.poll(timeout_s):
        raise TimeoutError(f"{proc.name} (pid {proc.pid}) did not answer in {timeout_s:.0f} s")
    message: tuple[str, Any] = conn.recv()
    return message


def run_suite(name: str, quick: bool, progress: Callable[[str], None]) -> list[Result]:
    """``name``'s ``run(quick, progress)`` in a fresh spawned process (why: the docstring
    of ``bench/__main__.py``), relaying its progress; its results come back pickled. A
    suite that raises, or a process that dies, fails the run with what it left."""
    results: list[Result] = run_child(_suite_main, (name, quick), name, name, progress)
    return results


def run_child(
    target: Callable[..., None],
    args: tuple[Any, ...],
    name: str,
    what: str,
    progress: Callable[[str], None],
    *,
    silence_s: float | None = None,
    join_s: float = 60.0,
) -> Any:
    """``target(conn, *args)`` in a fresh spawned process; what it sends last, through
    :func:`relay`. It is then given ``join_s`` to close what it started, and killed
    after that (our own child, by pid)."""
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe(duplex=False)
    # Not a daemon: children start processes of their own (writer pools, Spark).
    proc = ctx.Process(target=target, args=(child_conn, *args), name=name)
    proc.start()
    child_conn.close()
    try:
        return relay(proc, conn, what, progress, silence_s)
    finally:
        conn.close()
        proc.join(join_s)
        if proc.is_alive():
            log.warning("%s (pid %d) still running after its results: killing it", what, proc.pid)
            proc.kill()
            proc.join(10)


def relay(
    proc: BaseProcess,
    conn: Connection,
    what: str,
    progress: Callable[[str], None],
    silence_s: float | None = None,
) -> Any:
    """What a child process sends last, its ``("progress", step)`` messages relayed on
    the way; ``("error", traceback)`` or a child that ends first fail with it. With
    ``silence_s``, a child that says nothing for that long fails too."""
    while True:
        if silence_s is not None and not wait([conn, proc.sentinel], silence_s):
            raise TimeoutError(f"{what} (pid {proc.pid}) said nothing for {silence_s:.0f} s")
        try:
            kind, payload = conn.recv()
        except EOFError:
            proc.join(10)
            raise RuntimeError(
                f"{what} (pid {proc.pid}) ended with exit code {proc.exitcode} "
                "before reporting its results"
            ) from None
        if kind == "progress":
            progress(payload)
        elif kind == "error":
            raise RuntimeError(f"{what} failed:\n{payload}")
        else:
            return payload


def _suite_main(conn: Connection, name: str, quick: bool) -> None:
    """A suite's process: ``("progress", step)`` messages, then ``("results", list)``
    or ``("error", traceback)``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sending = threading.Lock()  # a suite may report progress from its threads

    def progress(step: str) -> None:
        with sending:
            conn.send(("progress", step))

    try:
        module = importlib.import_module(name)
        results: list[Result] = module.run(quick, progress=progress)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    else:
        conn.send(("results", results))
    finally:
        conn.close()
