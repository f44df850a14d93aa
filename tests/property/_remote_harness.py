"""A real gateway process with the test-only fail points on, and the clients' side of them.

The gateway is ``python -m percolake.chaos.serve`` (exactly ``percolake serve`` plus
the test switches) with ``PERCOLAKE_TEST_SERVE_FAILPOINTS=1``; a test steers the fail
points of one transaction through an attached handle (see
:mod:`percolake.chaos.failpoints_serve`), so the transaction's own client calls stay
the public API, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from percolake.chaos.failpoints_serve import CONTROL_TABLE, SERVE_FAILPOINTS_ENV
from tests.servers import TEST_BUILD_SERVE, ServerProcess
from txn.remote import RemoteTransaction, RemoteTransactionManager

CONTROL_COLUMN = b"v"


def failpoint_gateway(
    workdir: Path, store_url: str = "memory://", extra_args: Sequence[str] = ()
) -> ServerProcess:
    """A started gateway of the test build with its fail points on (all roles)."""
    return ServerProcess(
        "all",
        ["--store", store_url, *extra_args],
        workdir,
        env={SERVE_FAILPOINTS_ENV: "1"},
        command=TEST_BUILD_SERVE,
    ).start()


def steer(handle: RemoteTransaction, points: Mapping[bytes, bytes]) -> None:
    """Set fail points of ``handle``'s transaction (``handle`` is an attached one)."""
    assert handle.attached, "steer through an attached handle: it must not flush owner writes"
    for name, value in points.items():
        handle.put(CONTROL_TABLE, name, CONTROL_COLUMN, value)
    handle.flush()


def control_handle(manager: RemoteTransactionManager, txn_id: str) -> RemoteTransaction:
    """An attached handle that only ever carries fail point writes."""
    return manager.attach(txn_id)
