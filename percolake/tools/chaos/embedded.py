"""``python -m percolake.tools.chaos.embedded``: an embedded oracle beside ``serve`` replicas.

An embedded manager (``TransactionManager.embedded``) builds its own
:class:`tso.TimestampOracle`: it claims the store (on SQLite, for as long as it lives)
and takes the store's ``tso`` leader row with a lease of its own, beside any
``percolake serve`` replicas of the same store. This process builds that oracle exactly
so, and lets the chaos harness ask it for timestamps over gRPC
(``TimestampService``), so that the timestamp checker sees its answers in one history
with the replicas'. It advertises no address in the row (an embedded manager cannot be
forwarded to), and it refuses to start (exit 3) while a replica leads, as an embedded
manager does. Woken from a pause, it reaches its store late, like the replicas of the
run (``--store-reconnect-ms``, :mod:`percolake.tools.chaos._reconnect`).

Same ``--listen``, ``--ready-file`` and ``--grace-s`` as ``percolake serve``, so that the
harness starts, kills, pauses and restarts it like a replica.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from percolake.serve.signals import StopSignals
from percolake.tools.chaos._reconnect import reconnect_ms_from_env, store_opener
from tso import DEFAULT_LEASE_MS, OracleAlreadyRunningError, TimestampOracle, check_lease_ms
from tso.timestamp_service import TimestampServicer
from wire.channels import parse_address
from wire.v1 import timestamp_pb2_grpc

log = logging.getLogger("percolake.tools.chaos.embedded")

#: As ``percolake serve``: another oracle serves the store.
EXIT_STORE_IN_USE = 3


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = argparse.ArgumentParser(prog="python -m percolake.tools.chaos.embedded")
    parser.add_argument("--store", required=True, help="the store URL the replicas serve")
    parser.add_argument("--listen", required=True, help="HOST:PORT of the timestamp service")
    parser.add_argument("--ready-file", help="written with the port once serving")
    parser.add_argument("--grace-s", type=float, default=2.0)
    parser.add_argument("--leader-lease-ms", type=int, default=DEFAULT_LEASE_MS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        parse_address(args.listen)
        lease_ms = check_lease_ms(args.leader_lease_ms)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    store = store_opener(reconnect_ms_from_env())(args.store)
    try:
        try:
            oracle = TimestampOracle(store, leader_lease_ms=lease_ms)
        except OracleAlreadyRunningError as exc:
            sys.stderr.write(f"percolake.tools.chaos.embedded: {exc}\n")
            return EXIT_STORE_IN_USE
        try:
            return _serve(oracle, args.listen, args.ready_file, args.grace_s)
        finally:
            oracle.close()
    finally:
        store.close()


def _serve(oracle: TimestampOracle, listen: str, ready_file: str | None, grace_s: float) -> int:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="embedded-rpc"),
        options=[("grpc.so_reuseport", 0)],
    )
    timestamp_pb2_grpc.add_TimestampServiceServicer_to_server(TimestampServicer(oracle), server)
    checks = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    checks.set("", health_pb2.HealthCheckResponse.SERVING)
    host, _ = parse_address(listen)
    log.info("embedded oracle serving timestamps on %s:%d", host, port)
    # Not an untimed Event.wait(): a SIGTERM another thread takes would never end it
    # (percolake.serve.signals). Caught before the ready file says we serve.
    signals = StopSignals((signal.SIGTERM, signal.SIGINT))
    try:
        if ready_file:
            Path(ready_file).write_text(f"{port}\n")
        signals.wait()
    finally:
        signals.close()
    server.stop(grace_s).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
