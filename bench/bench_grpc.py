"""The services through gRPC: timestamps, lock pairs and commit latency.

Starts a real ``percolake serve`` process on loopback (memory store, so that the
figures measure the RPC path rather than the disk), and drives it from this process.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench._results import Figure, measure
from lockserver.server import RemoteLockService
from percolake.rpc import Connection
from tests.servers import ServerProcess
from tso.server import RemoteTimestampSource
from txn import TransactionManager

PERCOLATOR_ORACLE = "Percolator (OSDI'10): about 2M timestamps/s from one oracle, with batching"


def _timestamps_per_second(address: str, callers: int, seconds: float) -> float:
    conn = Connection(address)
    source = RemoteTimestampSource(conn)
    counts = [0] * callers
    stop = time.monotonic() + seconds

    def caller(slot: int) -> None:
        n = 0
        while time.monotonic() < stop:
            source.next_timestamp()
            n += 1
        counts[slot] = n

    started = time.monotonic()
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    conn.close()
    return sum(counts) / elapsed


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


def run(quick: bool, progress: Callable[[str], None] = lambda _: None) -> list[Figure]:
    seconds = 1.0 if quick else 3.0
    runs = 2 if quick else 3
    commits = 100 if quick else 400
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess("all", ["--store", "memory://"], Path(tmp)).start()
        try:
            for callers in (1, 8, 64):
                name = f"tso.grpc.clients{callers}.ts_per_s"
                progress(name)

                def once(c: int = callers) -> float:
                    return _timestamps_per_second(server.address, c, seconds)

                note = "one client process; concurrent callers share RPCs through the batcher"
                figures.append(measure(name, "timestamps/s", PERCOLATOR_ORACLE, runs, once, note))
            progress("tso.grpc.range1000.ts_per_s")
            figures.append(
                measure(
                    "tso.grpc.range1000.ts_per_s",
                    "timestamps/s",
                    PERCOLATOR_ORACLE,
                    runs,
                    lambda: _range_timestamps_per_second(server.address, 1000, seconds),
                    note="one caller taking ranges of 1000: the oracle's capacity per RPC",
                )
            )
            progress("locks.grpc.lock_unlock_pairs_per_s")
            figures.append(
                measure(
                    "locks.grpc.lock_unlock_pairs_per_s",
                    "pairs/s",
                    "AtlasDB: 1 + 3 synchronous lock/timestamp calls per write transaction",
                    runs,
                    lambda: _lock_pairs_per_second(server.address, seconds),
                )
            )
            for cells in (1, 100):
                progress(f"gateway.commit.cells{cells}")
                latencies = sorted(_commit_latencies_ms(server.address, cells, commits))
                p50 = statistics.median(latencies)
                p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
                for label, value in (("p50", p50), ("p99", p99)):
                    figures.append(
                        Figure(
                            f"gateway.commit.cells{cells}.{label}_ms",
                            round(value, 3),
                            "ms",
                            1,
                            0.0,
                            "no published anchor: begin + writes + commit through the gateway",
                            note=f"{commits} sequential commits, memory store",
                        )
                    )
        finally:
            server.stop()
    return figures
