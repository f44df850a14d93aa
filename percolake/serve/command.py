"""``percolake serve`` itself: its arguments made a :class:`ServeConfig`, the server run
until a signal, its drain, and the exit codes (docs/operations.md)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from percolake.serve.config import DEFAULT_LISTEN, DEFAULT_STORE, ServeConfig
from percolake.serve.running import RunningServer
from percolake.serve.signals import StopSignals
from percolake.serve.startup import StartupError, check_tls_files
from percolake.serve.testing import TestBuild
from spark_integration.service import LakehouseLimits
from tso import OracleAlreadyRunningError
from txn import TransactionConfig
from txn.gateway import GatewayLimits
from wire.auth import TlsConfig, resolve_token

# The name operators filter on (docs/operations.md) since serve was one module.
log = logging.getLogger("percolake.server")

#: ``percolake serve`` could not start: another oracle already serves the store (S7).
EXIT_STORE_IN_USE = 3
#: ``percolake serve`` could not start as configured (a flag's TLS files, ports).
EXIT_BAD_FLAG = 2
#: The signals that drain and stop ``percolake serve``.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How often the main thread looks whether the drain thread has finished.
_DRAIN_WATCH_S = 0.05


def serve(config: ServeConfig, build: TestBuild | None = None) -> int:
    """Run until SIGTERM, SIGINT or SIGHUP, then drain (:meth:`RunningServer.stop`) and
    exit 0. SIGHUP drains too: a hang-up should not leave the lease to run out. A
    second signal during the drain ends it at once. ``build``: a test build's switches
    (:mod:`percolake.serve.testing`); the installed command passes none.

    The main thread only waits for signals (:class:`StopSignals`, never an untimed
    wait, which a signal landing on another thread does not interrupt); the drain runs
    in a thread of its own, so that the main thread goes on watching for the second
    signal while the drain waits (on open transactions, on gRPC's stop)."""
    hurry = threading.Event()
    # Before the server starts: a signal as soon as it is ready (its ready file
    # written) must find the handler, not kill the process with the lease held.
    signals = StopSignals(_STOP_SIGNALS)
    try:
        running = RunningServer(config, hurry, build)
        name = signals.wait()
        log.info("received %s; draining for up to %.1f s, then stopping", name, config.grace_s)
        _stop_watching(running, signals, hurry)
    finally:
        # Stopped (or never started): nothing is left to drain, and later signals are
        # ignored (see StopSignals.close).
        signals.close()
    return 0


def _stop_watching(running: RunningServer, signals: StopSignals, hurry: threading.Event) -> None:
    """Stop ``running`` in a drain thread; a signal meanwhile ends the drain at once."""
    failed: list[BaseException] = []

    def stop() -> None:
        try:
            running.stop()
        except BaseException as exc:  # re-raised in the main thread below
            failed.append(exc)

    drain = threading.Thread(target=stop, name="percolake-drain")
    drain.start()
    while drain.is_alive():
        again = signals.wait(_DRAIN_WATCH_S)
        if again is not None and not hurry.is_set():
            log.info("received %s again; ending the drain now", again)
            hurry.set()
    drain.join()
    if failed:
        raise failed[0]


def serve_from_args(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    *,
    build: TestBuild | None = None,
) -> int:
    """Validate the arguments (exit 2 naming the problem, before listening) and serve.

    ``build`` exists for the chaos test build only (:mod:`percolake.serve.testing`).
    """
    try:
        tls = None
        if args.tls_cert or args.tls_key or args.tls_client_ca:
            tls = check_tls_files(args.tls_cert, args.tls_key, args.tls_client_ca)
        config = ServeConfig(
            role=args.role,
            store_url=args.store or DEFAULT_STORE,
            listen=args.listen or DEFAULT_LISTEN,
            locks_on_store=args.role == "locks" and args.store is not None,
            leader_lease_ms=args.leader_lease_ms,
            leader_wait_s=args.leader_wait_s,
            tso_address=args.tso,
            locks_address=args.locks,
            token=resolve_token(token_file=args.token_file),
            tls=tls,
            client_tls=TlsConfig(ca_file=args.tls_ca) if args.tls_ca else None,
            max_message_bytes=args.max_message_mb * 1024 * 1024,
            limits=GatewayLimits(
                max_buffered_writes=args.max_writes_per_txn,
                max_open_transactions=args.max_open_txns,
                idle_timeout_s=args.idle_timeout_s,
            ),
            lakehouse_limits=LakehouseLimits(
                max_group_commits=args.max_group_commits,
                max_group_bytes=args.max_group_kb * 1024,
                max_group_wait_ms=args.max_group_wait_ms,
            ),
            txn_config=TransactionConfig(
                lease_ms=args.lease_ms,
                lock_wait_ms=args.lock_wait_ms,
                resolve_wait_ms=args.resolve_wait_ms,
            ),
            grace_s=args.grace_s,
            ready_file=args.ready_file,
            gc_interval_s=args.gc_interval_s,
            gc_retention_s=args.gc_retention_s,
            metrics_listen=args.metrics_listen,
        )
    except StartupError as exc:
        sys.stderr.write(f"percolake serve: {exc}\n")
        return EXIT_BAD_FLAG
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return serve(config, build)
    except StartupError as exc:
        sys.stderr.write(f"percolake serve: {exc}\n")
        return EXIT_BAD_FLAG
    except OracleAlreadyRunningError as exc:
        sys.stderr.write(f"percolake serve: {exc}\n")
        return EXIT_STORE_IN_USE
