"""The arguments of ``percolake serve``, apart from the server it starts.

Every ``percolake`` command builds its parser with them, so they stay cheap to import:
gRPC and the services (:mod:`percolake.serve.running`) load only when ``serve`` runs. The
chaos test build (``python -m percolake.tools.chaos.serve``) parses the same arguments.
"""

from __future__ import annotations

import argparse

from tso import DEFAULT_LEADER_WAIT_S, DEFAULT_LEASE_MS
from txn import TransactionConfig


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``percolake serve`` (also used by the chaos test build)."""
    parser.add_argument("role", nargs="?", default="all", choices=["all", "tso", "locks", "txn"])
    parser.add_argument(
        "--store", default=None, help="store URL (default sqlite:///.percolake/store.db)"
    )
    parser.add_argument(
        "--listen", default=None, help="HOST:PORT to listen on (default 127.0.0.1:7070)"
    )
    parser.add_argument(
        "--tso", help="the oracle's HOST:PORT, or its replicas' separated by commas (serve txn)"
    )
    parser.add_argument(
        "--locks",
        help="the lock server's HOST:PORT, or its replicas' separated by commas (serve txn)",
    )
    parser.add_argument(
        "--leader-lease-ms",
        type=int,
        default=DEFAULT_LEASE_MS,
        help="replicas on one store: the leader's lease; a dead leader is replaced after "
        "about this long (default %(default)s)",
    )
    parser.add_argument(
        "--leader-wait-s",
        type=float,
        default=DEFAULT_LEADER_WAIT_S,
        help="replicas: how long a call waits for a leader before it fails naming the "
        "cause (default %(default)g)",
    )
    parser.add_argument(
        "--token-file", help="require this bearer token on every call (default: $PERCOLAKE_TOKEN)"
    )
    parser.add_argument("--tls-cert", help="server certificate (PEM): enables TLS")
    parser.add_argument("--tls-key", help="server private key (PEM)")
    parser.add_argument("--tls-client-ca", help="require client certificates signed by this CA")
    parser.add_argument("--tls-ca", help="CA to trust when the gateway calls --tso and --locks")
    parser.add_argument("--max-message-mb", type=int, default=64, help="message size limit")
    parser.add_argument(
        "--max-writes-per-txn", type=int, default=1_000_000, help="cap on buffered writes"
    )
    parser.add_argument(
        "--max-open-txns", type=int, default=10_000, help="cap on open transactions"
    )
    parser.add_argument(
        "--idle-timeout-s", type=float, default=300.0, help="abort transactions idle this long"
    )
    parser.add_argument(
        "--max-group-commits",
        type=int,
        default=64,
        help="lakehouse appends to one table committed together in one transaction, at most",
    )
    parser.add_argument(
        "--max-group-wait-ms",
        type=float,
        default=30.0,
        help="how long a lakehouse group commit may wait for more appends (0: never)",
    )
    parser.add_argument(
        "--max-group-kb",
        type=int,
        default=4096,
        help="size bound of one lakehouse group commit (its file entries), in KiB",
    )
    parser.add_argument("--grace-s", type=float, default=30.0, help="drain time on SIGTERM")
    parser.add_argument(
        "--gc-interval-s",
        type=float,
        default=None,
        help="run a garbage-collection pass every N seconds in the background (default: off)",
    )
    parser.add_argument(
        "--gc-retention-s",
        type=float,
        default=600.0,
        help="garbage collection keeps every version a transaction younger than this may "
        "read (default %(default)s)",
    )
    parser.add_argument("--ready-file", help="write the bound port here once serving")
    parser.add_argument(
        "--metrics-listen",
        help="serve Prometheus metrics over plain HTTP at http://HOST:PORT/metrics "
        "(default: off; port 0 picks a free one)",
    )
    protocol = TransactionConfig()
    parser.add_argument(
        "--lease-ms",
        type=int,
        default=protocol.lease_ms,
        help="lease on a committer's locks (default %(default)s)",
    )
    parser.add_argument(
        "--lock-wait-ms",
        type=int,
        default=protocol.lock_wait_ms,
        help="how long a committer waits for another's locks (default %(default)s)",
    )
    parser.add_argument(
        "--resolve-wait-ms",
        type=int,
        default=protocol.resolve_wait_ms,
        help="how long a reader waits on a live committer (default %(default)s)",
    )
