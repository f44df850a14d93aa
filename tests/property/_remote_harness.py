"""A real gateway process with the test-only fail points on, and the clients' side of them.

The gateway is ``python -m percolake.tools.chaos.serve`` (exactly ``percolake serve`` plus
the test switches) with ``PERCOLAKE_TEST_SERVE_FAILPOINTS=1``; a test steers the fail
points of one transaction through an attached handle (see
:mod:`percolake.tools.chaos.failpoints_serve`), so the transaction's own client calls stay
the public API, unchanged. Controls of the whole gateway (a garbage-collection pass,
forgetting a finished transaction) travel in a throwaway transaction
(:func:`gateway_control`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from percolake.tools.chaos.failpoints_serve import (
    BROKEN_SETTLE_ENV,
    CONTROL_TABLE,
    GC_PASS,
    SERVE_FAILPOINTS_ENV,
    STATUS_FORGET,
)
from tests.servers import TEST_BUILD_SERVE, ServerProcess
from txn.remote import RemoteTransaction, RemoteTransactionManager

CONTROL_COLUMN = b"v"
#: The gateway's test build whose commits trust get_for_update locks (broken on purpose).
TRUSTING_SERVE = "tests.property._trusting_serve"


def failpoint_gateway(
    workdir: Path,
    store_url: str = "memory://",
    extra_args: Sequence[str] = (),
    *,
    broken_settle: str = "",
    trust_locks: bool = False,
) -> ServerProcess:
    """A started gateway of the test build with its fail points on (all roles);
    ``broken_settle``: ``safe-point`` or ``read-only``, a build that settles as before
    issue 30 (broken on purpose, see :func:`~percolake.tools.chaos.failpoints_serve.
    steered_gateway_class`); ``trust_locks``: a build whose commits skip the conflict
    check of cells locked by ``get_for_update`` (broken on purpose, see
    :mod:`tests.property._trusting_serve`)."""
    return ServerProcess(
        "all",
        ["--store", store_url, *extra_args],
        workdir,
        env={SERVE_FAILPOINTS_ENV: "1", BROKEN_SETTLE_ENV: broken_settle},
        command=(TRUSTING_SERVE,) if trust_locks else TEST_BUILD_SERVE,
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


def gateway_control(manager: RemoteTransactionManager, points: Mapping[bytes, bytes]) -> None:
    """Send controls of the whole gateway (``gc.pass``, ``status.forget``) in a
    throwaway transaction; returns once the gateway carried them out."""
    carrier = manager.begin()
    try:
        steer(manager.attach(carrier.id), points)
    finally:
        carrier.abort()


def gc_pass(manager: RemoteTransactionManager) -> None:
    """One garbage-collection pass at retention 0 in the gateway, below its open
    transactions; its readers forget every cached outcome afterwards."""
    gateway_control(manager, {GC_PASS: b"1"})


def forget(manager: RemoteTransactionManager, txn_id: str) -> None:
    """The gateway forgets the finished ``txn_id`` and every cached outcome."""
    gateway_control(manager, {STATUS_FORGET: txn_id.encode()})
