"""``percolake chaos run|plan``: the command line of the chaos harness.

Wire into ``percolake``'s parser with :func:`add_chaos_commands` and dispatch parsed
``chaos`` commands to :func:`run_chaos_command`. ``python -m percolake.tools.chaos`` runs the
same commands on their own.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from percolake.tools.chaos._config import ISOLATIONS, NEMESES, WORKLOADS, RunConfig

log = logging.getLogger("percolake.tools.chaos")

EXIT_BAD_INPUT = 2


def _nemeses(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if names in ((), ("none",)):
        return ()
    unknown = [n for n in names if n not in NEMESES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown nemesis {', '.join(unknown)}: choose from {','.join(NEMESES)} or none"
        )
    return tuple(dict.fromkeys(names))


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--workload", required=True, choices=WORKLOADS)
    run.add_argument(
        "--nemesis",
        type=_nemeses,
        default=("kill", "pause"),
        help=f"comma-separated faults from {','.join(NEMESES)}, or none (default kill,pause)",
    )
    run.add_argument("--duration-s", type=float, default=60.0, help="length of the run (60)")
    run.add_argument(
        "--seed", type=int, default=None, help="decides faults and workload (default: random)"
    )
    store = run.add_mutually_exclusive_group()
    store.add_argument(
        "--store", help="sqlite:///PATH or cassandra://... (default: SQLite files in --out)"
    )
    store.add_argument(
        "--cassandra-nodes",
        type=int,
        default=0,
        help="start a Cassandra cluster of N nodes (replication factor min(3, N))",
    )
    run.add_argument("--out", required=True, type=Path, help="folder for history, report, plot")
    run.add_argument("--isolation", choices=ISOLATIONS, default="serializable")
    run.add_argument("--gateways", type=int, default=2, help="gateway processes (2)")
    run.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="replicas of percolake serve (role all) on the store instead of one oracle and "
        "one lock server; clients and gateways get every replica's address (0)",
    )
    run.add_argument(
        "--embedded",
        action="store_true",
        help="timestamps with replicas: an embedded oracle (as TransactionManager.embedded "
        "builds it) starts first and leads beside the replicas; leader faults hit it too",
    )
    run.add_argument(
        "--leader-lease-ms",
        type=int,
        default=2000,
        help="the replicas' (and the oracle's) leader lease (2000)",
    )
    run.add_argument(
        "--clients",
        type=int,
        default=6,
        help="client processes (6): even ones use gateways, odd ones commit in-process",
    )
    run.add_argument("--fault-gap-s", type=float, default=2.0, help="mean quiet time (2)")
    run.add_argument(
        "--rate",
        type=float,
        default=None,
        help="operations per second the clients start, all together (default: each "
        "client starts its next operation at once)",
    )
    run.add_argument("--lease-ms", type=int, default=2000, help="lock lease of committers")
    run.add_argument("--client-timeout-s", type=float, default=10.0, help="client RPC deadline")
    run.add_argument("--active-keys", type=int, default=8, help="list-append hot keys (8)")
    run.add_argument(
        "--pessimistic",
        action="store_true",
        help="bank: transfers lock both balances with get_for_update (source first, so "
        "opposite transfers deadlock and one aborts) before writing them",
    )
    run.add_argument(
        "--store-reconnect-ms",
        type=int,
        default=0,
        help="replicas (and the oracle) woken from a pause reach their store only this many "
        "ms later, as across a network (0: off)",
    )
    run.add_argument(
        "--ts-call-timeout-s",
        type=float,
        default=0.5,
        help="timestamps workload: deadline of one GetTimestamps call (0.5)",
    )
    run.add_argument(
        "--netns",
        choices=["auto", "on", "off"],
        default="auto",
        help="run in a network namespace of its own (auto: when the run owns its store)",
    )
    run.add_argument("--gzip-history", action="store_true", help="write history.jsonl.gz")
    run.add_argument(
        "--no-plot",
        dest="plot",
        action="store_false",
        help="skip plot.png (the report and history are written as always)",
    )
    run.add_argument(
        "--gc-interval-s",
        type=float,
        default=None,
        help="garbage collection in every gateway, a pass every N s (default: off)",
    )
    run.add_argument(
        "--gc-retention-s",
        type=float,
        default=1.0,
        help="with --gc-interval-s: keep what transactions younger than this read (1)",
    )
    run.add_argument(
        "--gc-grace-ms",
        type=int,
        default=None,
        help="with --gc-interval-s: the gateways' collection waits this long after raising "
        "the safe point (default 5000; set, gateways run the test build's collector)",
    )
    run.add_argument(
        "--late-settle-s",
        type=float,
        default=None,
        help="list-append: clients settle a commit whose outcome is unknown again this "
        "many seconds later through another gateway, and a sample of the others "
        "(default: off)",
    )
    run.add_argument(
        "--lakehouse-log-retention-s",
        type=float,
        default=None,
        help="lakehouse workload: the table's log retention in seconds, and clients expire "
        "it now and then, so versions expire during the run (default: the table's 30 days)",
    )
    run.add_argument(
        "--warehouse",
        choices=["local", "s3"],
        default="local",
        help="lakehouse workload: the table in a folder of the run (local), or in a bucket "
        "on a MinIO the run starts in its work folder (s3; enables the s3-pause and "
        "s3-kill nemeses)",
    )
    run.add_argument(
        "--unsafe-broken-protocol",
        action="store_true",
        help="TEST ONLY: commit without locks, conflict check before write; must find anomalies",
    )
    run.add_argument(
        "--unsafe-no-oracle-claim",
        action="store_true",
        help="TEST ONLY: oracles skip their file lock, so oracle-overlap faults let two serve",
    )
    run.add_argument(
        "--unsafe-leader-ignores-lease",
        action="store_true",
        help="TEST ONLY: a leading replica serves without checking its lease; a leader that "
        "wakes from a pause serves next to the new one",
    )


def add_chaos_commands(
    subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
) -> argparse.ArgumentParser:
    """Add ``chaos run|plan``; dispatch with :func:`run_chaos_command`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "chaos",
        help="Jepsen-style chaos runs: real processes, real faults, checked histories",
        description="Exit 0 when the run is clean, 1 when anomalies were found, 2 on bad "
        "input, 3 when the run itself failed.",
    )
    _add_actions(parser)
    parser.set_defaults(handler=run_chaos_command)
    return parser


def _add_actions(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="chaos_command", required=True, metavar="ACTION")
    run = actions.add_parser("run", help="run one bounded chaos test and check it")
    _add_run_arguments(run)
    shown = actions.add_parser("plan", help="print the fault schedule a run would follow")
    _add_run_arguments(shown)
    suite = actions.add_parser(
        "suite", help="the long runs of make chaos (three-node Cassandra, every fault)"
    )
    suite.add_argument("--out", type=Path, default=Path("tests/chaos/results"))
    suite.add_argument(
        "--work-dir",
        type=Path,
        default=Path(".percolake/chaos-work"),
        help="scratch data, removed after each clean run",
    )
    suite.add_argument("--seed", type=int, default=1)
    suite.add_argument(
        "--scale", type=float, default=1.0, help="multiply every run's duration (0.05: a smoke run)"
    )
    suite.add_argument("--only", help="comma-separated run names")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run's configuration; ``ValueError`` names what is wrong with the arguments."""
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    return RunConfig(
        workload=args.workload,
        out_dir=args.out.absolute(),
        duration_s=args.duration_s,
        seed=seed,
        nemeses=args.nemesis,
        isolation=args.isolation,
        store_url=args.store,
        cassandra_nodes=args.cassandra_nodes,
        gateways=args.gateways,
        clients=args.clients,
        replicas=args.replicas,
        embedded=args.embedded,
        leader_lease_ms=args.leader_lease_ms,
        ts_call_timeout_s=args.ts_call_timeout_s,
        store_reconnect_ms=args.store_reconnect_ms,
        fault_gap_s=args.fault_gap_s,
        rate=args.rate,
        lease_ms=args.lease_ms,
        client_timeout_s=args.client_timeout_s,
        active_keys=args.active_keys,
        pessimistic=args.pessimistic,
        netns=args.netns,
        unsafe_broken_protocol=args.unsafe_broken_protocol,
        unsafe_no_oracle_claim=args.unsafe_no_oracle_claim,
        unsafe_leader_ignores_lease=args.unsafe_leader_ignores_lease,
        gzip_history=args.gzip_history,
        plot=args.plot,
        gc_interval_s=args.gc_interval_s,
        gc_retention_s=args.gc_retention_s,
        gc_grace_ms=args.gc_grace_ms,
        late_settle_s=args.late_settle_s,
        lakehouse_log_retention_s=args.lakehouse_log_retention_s,
        warehouse=args.warehouse,
    )


def run_chaos_command(args: argparse.Namespace) -> int:
    """Carry out a parsed ``chaos`` command; returns the exit code."""
    if logging.getLogger().level > logging.INFO:  # the CLI shows progress
        logging.getLogger().setLevel(logging.INFO)
    if args.chaos_command == "suite":
        from percolake.tools.chaos._suite import run_suite

        if not args.scale > 0:
            sys.stderr.write("percolake chaos: --scale must be positive\n")
            return EXIT_BAD_INPUT
        only = set(args.only.split(",")) if args.only else None
        return run_suite(
            args.out.absolute(),
            args.work_dir.absolute(),
            seed=args.seed,
            scale=args.scale,
            only=only,
        )
    try:
        config = config_from_args(args)
    except ValueError as exc:
        sys.stderr.write(f"percolake chaos: {exc}\n")
        return EXIT_BAD_INPUT
    from percolake.tools.chaos._nemesis import plan

    if args.chaos_command == "plan":
        schedule = plan(config, owns_cassandra=config.cassandra_nodes > 0)
        rows: list[dict[str, Any]] = [
            {"at_s": f.at_s, "kind": f.kind, "target": f.target, "duration_s": f.duration_s}
            for f in schedule
        ]
        sys.stdout.write(json.dumps({"seed": config.seed, "faults": rows}, indent=1) + "\n")
        return 0
    from percolake.tools.chaos._run import run

    return run(config)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m percolake.tools.chaos run ...``."""
    parser = argparse.ArgumentParser(prog="percolake chaos", description="Chaos runs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    _add_actions(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return run_chaos_command(args)
