"""The ``percolake`` command line."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Sequence

from percolake import __version__
from percolake.serve.arguments import add_serve_arguments

log = logging.getLogger("percolake")

#: pip extra -> the top-level modules it installs that a command imports. A command that
#: needs one names the extra and exits 2 instead of failing deep inside with a traceback
#: (``pip install percolake`` alone must leave every command working or saying why not).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark", "pyarrow", "pandas"),
    "cassandra": ("cassandra",),
    "bench": ("deltalake", "pyiceberg"),
}
EXIT_MISSING_EXTRA = 2


def _missing_extras(extras: Sequence[str]) -> list[str]:
    """The extras among ``extras`` with a module that is not installed (nothing imported)."""
    return [
        extra
        for extra in extras
        if any(importlib.util.find_spec(module) is None for module in EXTRA_MODULES[extra])
    ]


def _store_extras(url: str | None) -> list[str]:
    """The extra a store URL's backend needs (``cassandra://`` -> cassandra), if any."""
    if not url or "://" not in url:
        return []  # the default store, or a malformed URL the command reports itself
    from storage_adapters import AVAILABLE_STORES

    backend = AVAILABLE_STORES.get(url.split("://", 1)[0])
    return [backend[2]] if backend is not None and backend[2] is not None else []


def extras_needed(args: argparse.Namespace) -> list[str]:
    """The pip extras a parsed command needs beyond the core dependencies."""
    command = args.command
    if command in ("serve", "gc"):
        return _store_extras(args.store)
    if command == "demo":
        return [] if args.tour else ["spark"]
    if command == "cassandra":
        # start and status ask each node over CQL; stop and fetch need only the JDK
        return ["cassandra"] if args.cassandra_command in ("start", "status") else []
    if command == "s3":
        # MinIO is a Go binary and its probe plain HTTP; only creating buckets uses pyarrow
        return ["spark"] if args.s3_command == "start" and args.bucket else []
    if command == "chaos":
        if args.chaos_command == "suite":
            return ["cassandra", "spark"]  # its runs use a three-node Cassandra, lakehouse
        if args.chaos_command != "run":
            return []  # plan only prints the schedule
        needed = ["spark"] if args.workload == "lakehouse" else []
        if args.cassandra_nodes:
            needed.append("cassandra")
        return needed + [e for e in _store_extras(args.store) if e not in needed]
    return []


def _command_name(args: argparse.Namespace) -> str:
    action = getattr(args, f"{args.command}_command", None)
    return f"percolake {args.command}" + (f" {action}" if action else "")


def _extra_of_module(module: str | None) -> str | None:
    root = (module or "").split(".", 1)[0]
    return next((extra for extra, mods in EXTRA_MODULES.items() if root in mods), None)


def _missing_extra_error(command: str, extras: Sequence[str]) -> int:
    names = " and ".join(f"'{extra}'" for extra in extras)
    noun = "extras" if len(extras) > 1 else "extra"
    sys.stderr.write(
        f"{command} needs the {names} {noun}: pip install 'percolake[{','.join(extras)}]'\n"
    )
    return EXIT_MISSING_EXTRA


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
    add_serve_arguments(serve)

    gc = commands.add_parser(
        "gc",
        help="run one garbage-collection pass: sweep old versions, collect the transactions table",
        description="Sweeps versions no transaction younger than the retention (nor any "
        "registered live one) can read, and deletes transactions-table entries no reader "
        "needs any more (rules S8, S9).",
    )
    gc.add_argument("--store", required=True, help="store URL")
    gc.add_argument(
        "--retention-s",
        type=float,
        default=600.0,
        help="keep what transactions younger than this may read (default %(default)s)",
    )
    gc.add_argument(
        "--grace-ms",
        type=int,
        default=None,
        help="wait this long after raising the safe point before deleting (default 5000); "
        "a longer grace the store holds, which readers may have leased, is waited instead "
        "until a pass outlasted it (the report says which grace was used)",
    )
    gc.add_argument(
        "--max-versions-per-s",
        type=float,
        default=None,
        help="delete at most this many versions a second (default: no limit)",
    )
    gc.add_argument("--json", action="store_true", help="print the report as JSON")

    status = commands.add_parser(
        "status",
        help="who leads a replica set of 'percolake serve', epochs, lease ages, open transactions",
        description="Asks each address (ControlService.GetStatus) and prints one line per "
        "process. Exit 0 when every address answered and each election has exactly one "
        "leader, 1 otherwise.",
    )
    status.add_argument(
        "--gateway",
        required=True,
        help="HOST:PORT of a percolake serve process, or several separated by commas",
    )
    status.add_argument("--json", action="store_true", help="print the answers as JSON")
    status.add_argument("--token-file", help="bearer token file (default: $PERCOLAKE_TOKEN)")
    status.add_argument("--tls-ca", help="CA to trust: connect with TLS")
    status.add_argument(
        "--tls-cert", help="client certificate (PEM), for servers that require one (mutual TLS)"
    )
    status.add_argument("--tls-key", help="the client certificate's private key (PEM)")
    status.add_argument(
        "--timeout-s", type=float, default=5.0, help="how long each address may take to answer"
    )

    from percolake.tools.cassandra import add_cassandra_commands
    from percolake.tools.chaos.cli import add_chaos_commands
    from percolake.tools.s3 import add_s3_commands

    add_cassandra_commands(commands)
    add_s3_commands(commands)
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


def _gc(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import json
    from dataclasses import asdict

    from tqdm import tqdm  # a core dependency: progress bars belong to the core CLI

    from storage_adapters import open_store
    from txn import DEFAULT_GRACE_MS, GarbageCollector

    try:
        store = open_store(args.store)
        collector = GarbageCollector(
            store,
            retention_s=args.retention_s,
            grace_ms=DEFAULT_GRACE_MS if args.grace_ms is None else args.grace_ms,
            max_versions_per_s=args.max_versions_per_s,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        # A bar only for a person watching: redirected to a file or a log collector, its
        # carriage-return redraws are noise in every line.
        quiet = args.json or not sys.stderr.isatty()
        with tqdm(unit="table", desc="gc", file=sys.stderr, disable=quiet) as bar:

            def progress(table: str) -> None:
                bar.set_postfix_str(table)
                bar.update(1)

            report = collector.run_once(progress)
    finally:
        store.close()
    print(json.dumps(asdict(report)) if args.json else report.summary())
    return 0


def _status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from percolake.serve.status import run_status
    from wire.auth import TlsConfig, resolve_token
    from wire.channels import parse_addresses

    try:
        parse_addresses(args.gateway)
        token = resolve_token(token_file=args.token_file)
        if bool(args.tls_cert) != bool(args.tls_key):
            raise ValueError("--tls-cert and --tls-key go together: give both or neither")
        tls = None
        if args.tls_ca or args.tls_cert:
            tls = TlsConfig(cert_file=args.tls_cert, key_file=args.tls_key, ca_file=args.tls_ca)
            tls.channel_credentials()  # reads the files now: a clear error, not a hang
        if not args.timeout_s > 0:
            raise ValueError(f"--timeout-s must be positive, got {args.timeout_s}")
    except ValueError as exc:
        parser.error(str(exc))
    return run_status(
        args.gateway, token=token, tls=tls, as_json=args.json, timeout_s=args.timeout_s
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    missing = _missing_extras(extras_needed(args))
    if missing:  # before anything starts: no half-launched cluster, no traceback
        return _missing_extra_error(_command_name(args), missing)
    try:
        return _run(args, parser)
    except ModuleNotFoundError as exc:
        # A path extras_needed does not foresee (bench suites, a new option): still name
        # the extra rather than show a traceback. Any other missing module is a bug.
        extra = _extra_of_module(exc.name)
        if extra is None:
            raise
        log.debug("missing module %s", exc.name, exc_info=True)
        return _missing_extra_error(_command_name(args), [extra])


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    quiet = args.command in ("demo", "check", "status")  # their output is the report itself
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "check":
        from percolake.tools.checker import run_check

        return run_check(args.history, args.model, as_json=args.json, out=sys.stdout)
    if args.command == "chaos":
        from percolake.tools.chaos.cli import run_chaos_command

        return run_chaos_command(args)
    if args.command == "cassandra":
        from percolake.tools.cassandra import run_cassandra_command

        return run_cassandra_command(args)
    if args.command == "s3":
        from percolake.tools.s3 import run_s3_command

        return run_s3_command(args)
    if args.command == "serve":
        from percolake.serve.command import serve_from_args

        return serve_from_args(args, parser)
    if args.command == "gc":
        return _gc(args, parser)
    if args.command == "status":
        return _status(args, parser)
    if args.command == "bench":
        return _bench(args, parser)
    if args.command == "demo":
        from pathlib import Path

        if args.tour:
            from percolake.tools.demo import run_demo

            return run_demo(Path(args.workdir or ".percolake"), sys.stdout)
        from percolake.tools.pipeline import default_workdir, run_pipeline

        return run_pipeline(Path(args.workdir) if args.workdir else default_workdir(), sys.stdout)
    parser.error(f"unknown command {args.command!r}")
    return 2
