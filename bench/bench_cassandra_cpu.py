"""Where a 100-cell commit's CPU goes on Cassandra, against 100 raw inserts (issue 27).

On a machine whose Cassandra nodes share the client's cores, a one-client commit is
bound by CPU, not by round trips: what a transaction can reach against raw inserts is
about the ratio of the CPU both spend. This measures it, per operation, on the same
cluster in the same run as the commit figures (``python -m bench.bench_cassandra
--only-commit``):

* server CPU: user + system time of the Cassandra processes serving the URL on this
  machine (found by their listening sockets), before and after ``RUNS`` operations;
* client CPU: this process's time over the same operations.

Operations, each on fresh cells: ``raw_inserts`` (100 prepared INSERTs at QUORUM, as
the txn_vs_raw figure's raw side), ``put_versions`` (the store's write of 100 versions
and their index rows), ``check_read`` (the conflict check's read of the same 100
cells' newest version timestamps, which rule S2 makes every commit do after its
writes), ``commit_point`` (one put-unless-exists, the LWT of rule S1) and
``transaction`` (a whole 100-cell transaction through ``TransactionManager``).
``cassandraN.cpu.cells100.raw_vs_txn.ratio`` is the CPU of the raw inserts over the
CPU of the transaction (server + client): the most ``txn_vs_raw`` can reach while the
cluster is CPU-bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench._proc_cpu import cpu_seconds, listening_pids
from bench._results import Figure, summarize
from storage_adapters import VersionWrite, open_store
from storage_adapters.cassandra import CassandraStore

CELLS = 100
RUNS = 150
VALUE = b"x" * 100
ANCHOR = "100 raw prepared INSERTs at QUORUM, same cluster, same run"


def server_pids(store: CassandraStore) -> list[int]:
    """The Cassandra processes on this machine serving ``store``'s cluster (empty when
    its nodes run elsewhere)."""
    port = store.settings.port
    hosts = {host.address for host in store._cluster.metadata.all_hosts()}
    return listening_pids({(host, port) for host in hosts})


def cpu_figures(url: str, progress: Callable[[str], None], *, runs: int = RUNS) -> list[Figure]:
    """Server and client CPU milliseconds per operation (module docstring), and the
    raw-over-transaction CPU ratio; none when the nodes are not on this machine."""
    from bench.bench_cassandra import RawWriter
    from bench.bench_cassandra_floor import figure_name
    from txn import TransactionManager

    store = open_store(url)
    assert isinstance(store, CassandraStore)
    name = figure_name(store)
    tm = TransactionManager.embedded(url)
    raw = RawWriter(store)
    try:
        pids = server_pids(store)
        if not pids:
            progress(f"{name}.cpu: no Cassandra process of this cluster on this machine")
            return []
        serial = iter(range(1 << 62))
        last: list[tuple[bytes, bytes]] = []

        def cells() -> list[tuple[bytes, bytes]]:
            n = next(serial)
            last[:] = [(f"cpu{time.time_ns()}-{n}-{i:03d}".encode(), b"c") for i in range(CELLS)]
            return last

        def put_versions() -> None:
            store.put_versions("bench_cpu", [VersionWrite(r, c, 7, VALUE) for r, c in cells()])

        def transaction() -> None:
            tx = tm.begin()
            for row, column in cells():
                tx.put("bench_cpu_txn", row, column, VALUE)
            tx.commit()

        operations: dict[str, Callable[[], object]] = {
            "raw_inserts": lambda: raw.write(cells()),
            "put_versions": put_versions,
            # The cells put_versions wrote last: the check reads back what it wrote.
            "check_read": lambda: store.get_version_timestamps("bench_cpu", last, limit=16),
            "commit_point": lambda: store.put_unless_exists(
                "bench_cpu_txns", f"{time.time_ns()}-{next(serial)}".encode(), b"c"
            ),
            "transaction": transaction,
        }
        server: dict[str, list[float]] = {op: [] for op in operations}
        client: dict[str, list[float]] = {op: [] for op in operations}
        put_versions()  # check_read reads these
        for run in operations.values():  # warm: prepared statements, connections
            for _ in range(10):
                run()
        for round_ in range(3):  # three rounds, every operation in each
            progress(f"{name}.cpu: round {round_ + 1}/3")
            for op, run in operations.items():
                if op == "check_read":
                    put_versions()
                s0, c0 = cpu_seconds(pids), time.process_time()
                for _ in range(runs // 3):
                    run()
                s1, c1 = cpu_seconds(pids), time.process_time()
                server[op].append((s1 - s0) * 1000 / (runs // 3))
                client[op].append((c1 - c0) * 1000 / (runs // 3))
    finally:
        tm.close()
        store.close()
    note = (
        f"CPU ms per operation of {CELLS} cells ({runs // 3} operations a round, 3 rounds), "
        f"user + system of the {len(pids)} Cassandra process(es) serving the cluster"
    )
    figures: list[Figure] = []
    for op in operations:
        figures.append(
            summarize(f"{name}.cpu.cells100.{op}.server_ms", "ms", ANCHOR, server[op], note)
        )
        figures.append(
            summarize(
                f"{name}.cpu.cells100.{op}.client_ms",
                "ms",
                ANCHOR,
                client[op],
                "CPU ms of the bench process per operation, same operations",
            )
        )
    figures.append(
        summarize(
            f"{name}.cpu.cells100.raw_vs_txn.ratio",
            "ratio",
            ANCHOR,
            [
                (server["raw_inserts"][i] + client["raw_inserts"][i])
                / (server["transaction"][i] + client["transaction"][i])
                for i in range(3)
            ],
            note="CPU (server + client) of 100 raw inserts / of a 100-cell transaction, "
            "per round: the most txn_vs_raw reaches while the cluster is CPU-bound",
        )
    )
    return figures
