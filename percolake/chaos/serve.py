"""``python -m percolake.chaos.serve txn ...``: a gateway with chaos-sized timeouts.

The same server as ``percolake serve txn`` (``percolake.server.serve``), plus the
protocol timeouts a chaos run needs short (``--lease-ms``, ``--lock-wait-ms``,
``--resolve-wait-ms``) so that a paused process outlives its leases within seconds.
It also honours the test-only broken-protocol switch (:mod:`percolake.chaos.unsafe`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from percolake.chaos.unsafe import install_broken_protocol_if_requested
from percolake.server import ServeConfig, serve
from txn import TransactionConfig
from txn.server import GatewayLimits


def build_parser() -> argparse.ArgumentParser:
    defaults = TransactionConfig()
    parser = argparse.ArgumentParser(prog="python -m percolake.chaos.serve")
    parser.add_argument("role", choices=["txn", "all"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--tso")
    parser.add_argument("--locks")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--grace-s", type=float, default=5.0)
    parser.add_argument("--idle-timeout-s", type=float, default=300.0)
    parser.add_argument("--lease-ms", type=int, default=defaults.lease_ms)
    parser.add_argument("--lock-wait-ms", type=int, default=defaults.lock_wait_ms)
    parser.add_argument("--resolve-wait-ms", type=int, default=defaults.resolve_wait_ms)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    install_broken_protocol_if_requested()
    config = ServeConfig(
        role=args.role,
        store_url=args.store,
        listen=args.listen,
        tso_address=args.tso,
        locks_address=args.locks,
        limits=GatewayLimits(idle_timeout_s=args.idle_timeout_s),
        txn_config=TransactionConfig(
            lease_ms=args.lease_ms,
            lock_wait_ms=args.lock_wait_ms,
            resolve_wait_ms=args.resolve_wait_ms,
        ),
        grace_s=args.grace_s,
        ready_file=args.ready_file,
    )
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
