"""The ``percolake`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from percolake import __version__

log = logging.getLogger("percolake")

#: ``percolake serve`` could not start: another oracle already serves the store (S7).
EXIT_STORE_IN_USE = 3


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="percolake", description="A transaction layer for data-lake metadata."
    )
    parser.add_argument("--version", action="version", version=f"percolake {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="check a recorded list-append history for isolation anomalies"
    )
    check.add_argument("history", help="history file, JSON lines (Elle list-append format)")
    check.add_argument(
        "--model",
        choices=["snapshot-isolation", "serializable"],
        default="snapshot-isolation",
        help="consistency model to check against (default: snapshot-isolation)",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")

    serve = commands.add_parser(
        "serve",
        help="run the oracle, lock server and transaction gateway (or one of them)",
        description="With no role, all three run in one process on the embedded store.",
    )
    serve.add_argument("role", nargs="?", default="all", choices=["all", "tso", "locks", "txn"])
    serve.add_argument(
        "--store", default=None, help="store URL (default sqlite:///.percolake/store.db)"
    )
    serve.add_argument(
        "--listen", default=None, help="HOST:PORT to listen on (default 127.0.0.1:7070)"
    )
    serve.add_argument("--tso", help="the oracle's HOST:PORT (serve txn)")
    serve.add_argument("--locks", help="the lock server's HOST:PORT (serve txn)")
    serve.add_argument(
        "--token-file", help="require this bearer token on every call (default: $PERCOLAKE_TOKEN)"
    )
    serve.add_argument("--tls-cert", help="server certificate (PEM): enables TLS")
    serve.add_argument("--tls-key", help="server private key (PEM)")
    serve.add_argument("--tls-client-ca", help="require client certificates signed by this CA")
    serve.add_argument("--tls-ca", help="CA to trust when the gateway calls --tso and --locks")
    serve.add_argument("--max-message-mb", type=int, default=64, help="message size limit")
    serve.add_argument(
        "--max-writes-per-txn", type=int, default=1_000_000, help="cap on buffered writes"
    )
    serve.add_argument("--max-open-txns", type=int, default=10_000, help="cap on open transactions")
    serve.add_argument(
        "--idle-timeout-s", type=float, default=300.0, help="abort transactions idle this long"
    )
    serve.add_argument("--grace-s", type=float, default=30.0, help="drain time on SIGTERM")
    serve.add_argument("--ready-file", help="write the bound port here once serving")
    from txn import TransactionConfig

    protocol = TransactionConfig()
    serve.add_argument(
        "--lease-ms",
        type=int,
        default=protocol.lease_ms,
        help="lease on a committer's locks (default %(default)s)",
    )
    serve.add_argument(
        "--lock-wait-ms",
        type=int,
        default=protocol.lock_wait_ms,
        help="how long a committer waits for another's locks (default %(default)s)",
    )
    serve.add_argument(
        "--resolve-wait-ms",
        type=int,
        default=protocol.resolve_wait_ms,
        help="how long a reader waits on a live committer (default %(default)s)",
    )

    from percolake.cassandra import add_cassandra_commands
    from percolake.chaos.cli import add_chaos_commands

    add_cassandra_commands(commands)
    add_chaos_commands(commands)

    bench = commands.add_parser(
        "bench", help="run the benchmarks (from a source checkout) and write bench/results/"
    )
    bench.add_argument("--quick", action="store_true", help="short runs (under two minutes)")
    bench.add_argument("--only", action="append", help="run only this suite (repeatable)")
    bench.add_argument("--out", help="results directory (default bench/results[/quick])")
    bench.add_argument("--no-readme", action="store_true", help="leave the README's table")

    demo = commands.add_parser(
        "demo",
        help="the main job: PySpark writers committing through 'percolake serve' (make run)",
    )
    demo.add_argument(
        "--tour", action="store_true", help="a tour of the transaction layer instead (no Spark)"
    )
    demo.add_argument("--workdir", default=None, help="where the demo's store and tables go")
    return parser


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from percolake.rpc import TlsConfig, resolve_token
    from percolake.server import DEFAULT_LISTEN, DEFAULT_STORE, ServeConfig, serve
    from txn import TransactionConfig
    from txn.server import GatewayLimits

    try:
        tls = None
        if args.tls_cert or args.tls_key or args.tls_client_ca:
            tls = TlsConfig(args.tls_cert, args.tls_key, args.tls_client_ca)
            tls.server_credentials()  # reads the files now: fail before listening
        config = ServeConfig(
            role=args.role,
            store_url=args.store or DEFAULT_STORE,
            listen=args.listen or DEFAULT_LISTEN,
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
            txn_config=TransactionConfig(
                lease_ms=args.lease_ms,
                lock_wait_ms=args.lock_wait_ms,
                resolve_wait_ms=args.resolve_wait_ms,
            ),
            grace_s=args.grace_s,
            ready_file=args.ready_file,
        )
        if args.role == "locks" and args.store:
            raise ValueError("the lock server keeps no data: --store does not apply to it")
    except ValueError as exc:
        parser.error(str(exc))
    from tso._oracle import OracleAlreadyRunningError

    try:
        return serve(config)
    except OracleAlreadyRunningError as exc:
        sys.stderr.write(f"percolake serve: {exc}\n")
        return EXIT_STORE_IN_USE


def _bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import os

    sys.path.insert(0, os.getcwd())  # the benchmarks live in the checkout, not the package
    try:
        from bench.__main__ import main as bench_main
    except ImportError:
        parser.error("percolake bench runs from a source checkout (it needs bench/)")
    argv = ["--quick"] if args.quick else []
    for suite in args.only or []:
        argv += ["--only", suite]
    if args.out:
        argv += ["--out", args.out]
    if args.no_readme:
        argv.append("--no-readme")
    return bench_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    quiet = args.command in ("demo", "check")  # their output is the report itself
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "check":
        from percolake.checker import run_check

        return run_check(args.history, args.model, as_json=args.json, out=sys.stdout)
    if args.command == "chaos":
        from percolake.chaos.cli import run_chaos_command

        return run_chaos_command(args)
    if args.command == "cassandra":
        from percolake.cassandra import run_cassandra_command

        return run_cassandra_command(args)
    if args.command == "serve":
        return _serve(args, parser)
    if args.command == "bench":
        return _bench(args, parser)
    if args.command == "demo":
        from pathlib import Path

        if args.tour:
            from percolake.demo import run_demo

            return run_demo(Path(args.workdir or ".percolake"), sys.stdout)
        from percolake.pipeline import default_workdir, run_pipeline

        return run_pipeline(Path(args.workdir) if args.workdir else default_workdir(), sys.stdout)
    parser.error(f"unknown command {args.command!r}")
    return 2
