"""The services through gRPC: timestamps, lock pairs and commit latency.

Starts a real ``percolake serve`` process on loopback (memory store, so that the
figures measure the RPC path rather than the disk), and drives it from this process.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench._load import run_threads
from bench._results import Figure, Growth, Latency, Result, measure, percentiles, summarize
from lockserver.lock_service import RemoteLockService
from tests.servers import ServerProcess
from tso.aio import AsyncTimestampSource
from tso.timestamp_service import RemoteTimestampSource
from txn import TransactionManager
from wire.channels import Connection

PERCOLATOR_ORACLE = "Percolator (OSDI'10): about 2M timestamps/s from one oracle, with batching"


def _timestamps_per_second(address: str, callers: int, seconds: float) -> float:
    conn = Connection(address)
    try:
        source = RemoteTimestampSource(conn)
        run = run_threads(lambda _: source.next_timestamp(), callers, seconds)
    finally:
        conn.close()
    if run.failed:
        raise RuntimeError(f"{run.failed} timestamp calls failed (see the debug log)")
    return run.rate


def _async_timestamps_per_second(address: str, callers: int, seconds: float) -> float:
    """Like :func:`_timestamps_per_second`, with coroutines on one event loop."""

    async def measure_rate() -> float:
        async with AsyncTimestampSource(address) as source:
            stop = time.monotonic() + seconds
            counts = [0] * callers

            async def caller(slot: int) -> None:
                while time.monotonic() < stop:
                    await source.next_timestamp()
                    counts[slot] += 1

            started = time.monotonic()
            await asyncio.gather(*(caller(i) for i in range(callers)))
            return sum(counts) / (time.monotonic() - started)

    return asyncio.run(measure_rate())


def _range_timestamps_per_second(address: str, size: int, seconds: float) -> float:
    conn = Connection(address)
    source = RemoteTimestampSource(conn)
    served = 0
    stop = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < stop:
        served += source.next_range(size).count
    elapsed = time.monotonic() - started
    conn.close()
    return served / elapsed


def _lock_pairs_per_second(address: str, seconds: float) -> float:
    conn = Connection(address)
    locks = RemoteLockService(conn)
    n = 0
    stop = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < stop:
        token = locks.lock([f"bench-{n}".encode()], "bench", 10_000)
        assert token is not None
        locks.unlock(token)
        n += 1
    elapsed = time.monotonic() - started
    conn.close()
    return n / elapsed


def _commit_latencies_ms(address: str, cells: int, commits: int) -> list[float]:
    tm = TransactionManager.remote(address)
    out = []
    for n in range(commits):
        started = time.perf_counter()
        with tm.begin() as tx:
            for c in range(cells):
                tx.put("bench", f"r{n:07d}-{c:04d}".encode(), b"v", b"x" * 16)
        out.append((time.perf_counter() - started) * 1000)
    tm.close()
    return out


#: Percolator (OSDI'10, section 2.4): "the timestamp oracle ... serves around
#: 2 million timestamps per second from a single machine".
PERCOLATOR_TS_PER_S = 2_000_000.0
CALLERS = (1, 8, 64)


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Result]:
    seconds = 1.0 if quick else 3.0
    runs = 2 if quick else 3
    commits = 90 if quick else 600
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess("all", ["--store", "memory://"], Path(tmp)).start()
        try:
            by_callers: list[tuple[float, float]] = []
            note = "one client process; concurrent callers share RPCs through the batcher"
            for callers in CALLERS:
                name = f"tso.grpc.clients{callers}.ts_per_s"
                progress(name)

                def once(c: int = callers) -> float:
                    return _timestamps_per_second(server.address, c, seconds)

                figure = measure(name, "timestamps/s", PERCOLATOR_ORACLE, runs, once, note)
                results.append(figure)
                by_callers.append((callers, figure.value))
            by_coroutines: list[tuple[float, float]] = []
            for callers in CALLERS:
                name = f"tso.grpc.async.clients{callers}.ts_per_s"
                progress(name)

                def once_async(c: int = callers) -> float:
                    return _async_timestamps_per_second(server.address, c, seconds)

                figure = measure(
                    name,
                    "timestamps/s",
                    PERCOLATOR_ORACLE,
                    runs,
                    once_async,
                    "one client process, callers are coroutines of tso.aio.AsyncTimestampSource "
                    "sharing RPCs through its batcher",
                )
                results.append(figure)
                by_coroutines.append((callers, figure.value))
            progress("tso.grpc.range1000.ts_per_s")
            ranged = measure(
                "tso.grpc.range1000.ts_per_s",
                "timestamps/s",
                PERCOLATOR_ORACLE,
                runs,
                lambda: _range_timestamps_per_second(server.address, 1000, seconds),
                note="one caller taking ranges of 1000: the oracle's capacity per RPC",
            )
            results.append(ranged)
            clients64 = results[len(CALLERS) - 1]
            async64 = results[2 * len(CALLERS) - 1]
            assert isinstance(clients64, Figure) and isinstance(async64, Figure)
            for figure, label in (
                (clients64, "clients64"),
                (async64, "async.clients64"),
                (ranged, "range1000"),
            ):
                results.append(
                    Figure(
                        f"tso.grpc.{label}.vs_percolator.ratio",
                        round(figure.value / PERCOLATOR_TS_PER_S, 4),
                        "ratio",
                        figure.runs,
                        figure.spread,
                        PERCOLATOR_ORACLE,
                        note=f"{figure.name} / Percolator's published 2,000,000 timestamps/s "
                        "(a published figure on other hardware, not measured in this run)",
                    )
                )
            results.append(
                Growth(
                    "tso.grpc.by_callers",
                    "Timestamps through gRPC by concurrent callers",
                    "concurrent callers in one client process",
                    "timestamps/s",
                    {
                        "threads (RemoteTimestampSource)": by_callers,
                        "coroutines (AsyncTimestampSource)": by_coroutines,
                    },
                    log_y=True,
                    note=f"medians of {runs} runs of {seconds:g} s; Percolator: 2M/s published",
                )
            )
            progress("locks.grpc.lock_unlock_pairs_per_s")
            results.append(
                measure(
                    "locks.grpc.lock_unlock_pairs_per_s",
                    "pairs/s",
                    "AtlasDB: 1 + 3 synchronous lock/timestamp calls per write transaction",
                    runs,
                    lambda: _lock_pairs_per_second(server.address, seconds),
                )
            )
            latency: dict[str, list[float]] = {}
            for cells in (1, 100):
                progress(f"gateway.commit.cells{cells}")
                # Three consecutive batches: each gives a p50 and a p99, whose median
                # and spread are the figures.
                chunks = [
                    _commit_latencies_ms(server.address, cells, commits // 3) for _ in range(3)
                ]
                latency[f"{cells} cell{'s' if cells > 1 else ''}"] = [
                    ms for chunk in chunks for ms in chunk
                ]
                for label in ("p50", "p99"):
                    results.append(
                        summarize(
                            f"gateway.commit.cells{cells}.{label}_ms",
                            "ms",
                            "no published anchor: begin + writes + commit through the gateway",
                            [percentiles(chunk)[label] for chunk in chunks],
                            note=f"3 batches of {commits // 3} sequential commits, memory store; "
                            f"the {label} of each batch",
                        )
                    )
            results.append(
                Latency.of(
                    "gateway.commit.latency",
                    "Commit latency through the gRPC gateway (memory store)",
                    "ms",
                    latency,
                    note="sequential begin + puts + commit from one client",
                )
            )
        finally:
            server.stop()
    return results
