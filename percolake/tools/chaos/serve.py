"""``python -m percolake.tools.chaos.serve ...``: ``percolake serve`` for chaos runs and tests.

Exactly ``percolake serve`` with the same arguments, except that it honours the
test-only switches of :mod:`percolake.tools.chaos.unsafe` (a broken commit protocol,
oracles that do not claim their store, leaders that do not check their lease) and the
gateway fail points that tests steer (:mod:`percolake.tools.chaos.failpoints_serve`: the
transaction service's, and the lakehouse service's group commits steered by a control
file; with ``PERCOLAKE_UNSAFE_BROKEN_SETTLE`` too, a gateway that settles as before
issue 30, broken on purpose), garbage collection with a short grace
(``PERCOLAKE_TEST_GC_GRACE_MS`` with ``--gc-interval-s``), and a store that answers late
after a pause of the process (:mod:`percolake.tools.chaos._reconnect`), which the
installed command never looks at. They reach the server as one
:class:`~percolake.serve.testing.TestBuild`, beside its configuration.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from percolake.serve.arguments import add_serve_arguments
from percolake.serve.command import serve_from_args
from percolake.serve.testing import TestBuild
from percolake.tools.chaos._reconnect import reconnect_ms_from_env, store_opener
from percolake.tools.chaos.failpoints_serve import (
    SteeredLakehouseServicer,
    collecting,
    gc_grace_ms_from_env,
    serve_failpoints_requested,
    steered_gateway_class,
)
from percolake.tools.chaos.unsafe import unsafe_build_from_env
from spark_integration.service import LakehouseServicer
from txn.gateway import TransactionServicer


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    build = unsafe_build_from_env()
    parser = argparse.ArgumentParser(
        prog="python -m percolake.tools.chaos.serve",
        description=(
            "percolake serve with the test-only switches of percolake.tools.chaos.unsafe "
            "and the gateway fail points of percolake.tools.chaos.failpoints_serve"
        ),
    )
    add_serve_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    steered = serve_failpoints_requested()
    gateway_class: type[TransactionServicer] = (
        steered_gateway_class() if steered else TransactionServicer
    )
    grace_ms = gc_grace_ms_from_env()
    if grace_ms is not None and args.gc_interval_s is not None:
        # The test build's collector instead of the installed one (same loop, short grace).
        gateway_class = collecting(gateway_class, args.gc_interval_s, args.gc_retention_s, grace_ms)
        args.gc_interval_s = None
    test_build = TestBuild(
        commit_steps=build.commit_steps,
        oracle_claims=build.oracle_claims,
        leader_checks_lease=build.leader_checks_lease,
        store_opener=store_opener(reconnect_ms_from_env()),
        gateway_class=gateway_class,
        lakehouse_class=SteeredLakehouseServicer if steered else LakehouseServicer,
    )
    return serve_from_args(args, parser, build=test_build)


if __name__ == "__main__":
    sys.exit(main())
