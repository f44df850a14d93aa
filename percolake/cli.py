"""The ``percolake`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from percolake import __version__

log = logging.getLogger("percolake")


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

    demo = commands.add_parser("demo", help="run the demo on the embedded SQLite store")
    demo.add_argument(
        "--workdir", default=".percolake", help="where the demo store goes (default .percolake)"
    )
    return parser


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
    if args.command == "demo":
        from pathlib import Path

        from percolake.demo import run_demo

        return run_demo(Path(args.workdir), sys.stdout)
    parser.error(f"unknown command {args.command!r}")
    return 2
