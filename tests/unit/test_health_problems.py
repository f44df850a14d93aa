"""What health answers, decided (issue 31 item 1): ``ControlPlane.serving_problem`` for
each reason a replica cannot serve, and ``HealthMonitor`` turning problems and a drain
into statuses. The real processes are in ``tests/integration/test_health.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from grpc_health.v1 import health, health_pb2

from percolake.serve.health import HealthMonitor
from percolake.serve.replica import TAKEOVER_LEASES, ControlPlane
from storage_adapters import KVStore, StoreError, open_store
from tso import TimestampOracle

pytestmark = pytest.mark.unit

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def store() -> Iterator[KVStore]:
    opened = open_store("memory://")
    yield opened
    opened.close()


def _replica(store: KVStore, address: str) -> ControlPlane:
    plane = ControlPlane(store, lease_ms=1000)
    plane.start(address)
    return plane


def test_a_leader_and_its_follower_serve(store: KVStore) -> None:
    leader, follower = _replica(store, "a:1"), _replica(store, "b:1")
    try:
        assert leader.serving_problem() is None
        assert follower.serving_problem() is None  # it forwards to a:1
    finally:
        follower.close()
        leader.close()
    assert leader.serving_problem() == "replica a:1 is shutting down"


def test_a_follower_names_each_reason_it_cannot_serve(
    store: KVStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, follower = _replica(store, "a:1"), _replica(store, "b:1")
    try:
        # The leader cannot be reached from here for over a lease.
        follower._unreachable_since = time.monotonic() - 1.5
        problem = follower.serving_problem()
        assert problem is not None and "leader a:1 (epoch 1) unreachable from here" in problem
        follower._unreachable_since = None
        # The row has not changed for longer than a takeover takes: no one took over.
        monkeypatch.setattr(follower.lease, "row_age_s", lambda: TAKEOVER_LEASES + 0.5)
        problem = follower.serving_problem()
        assert problem is not None and "has not renewed its lease for 2.6 s" in problem
        # A takeover still under way is no problem: calls wait for it.
        monkeypatch.setattr(follower.lease, "row_age_s", lambda: TAKEOVER_LEASES - 0.5)
        assert follower.serving_problem() is None
        # The last round could not reach the store.
        follower.lease.store_error = StoreError("connection refused")
        assert follower.serving_problem() == "store unreachable: connection refused"
    finally:
        follower.close()
        leader.close()


def test_a_replica_beside_an_embedded_oracle_cannot_serve(store: KVStore) -> None:
    embedded = TimestampOracle(store)  # leads alone, with no address to forward to
    replica = _replica(store, "b:1")
    try:
        problem = replica.serving_problem()
        assert problem is not None and "held by an embedded oracle" in problem
    finally:
        replica.close()
        embedded.close()


class _Statuses(health.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self.now: dict[str, int] = {}

    def set(self, service: str, status: int) -> None:  # type: ignore[override]
        self.now[service] = status
        super().set(service, status)  # type: ignore[arg-type]


def test_the_monitor_sets_statuses_from_problems_and_a_drain() -> None:
    problem: list[str | None] = [None]
    statuses = _Statuses()
    monitor = HealthMonitor(
        statuses,
        {"svc.Txn": lambda: problem[0]},
        always_serving=["svc.Txn", "svc.Control"],
        interval_s=3600,  # checked by hand below
    )
    try:
        assert statuses.now == {"svc.Control": SERVING, "svc.Txn": SERVING, "": SERVING}
        problem[0] = "store unreachable: down"
        monitor.check()
        assert statuses.now["svc.Txn"] == NOT_SERVING and statuses.now[""] == NOT_SERVING
        problem[0] = None
        monitor.check()
        assert statuses.now["svc.Txn"] == SERVING and statuses.now[""] == SERVING
        monitor.drain()
        # Each checked service says so; the server as a whole stays SERVING, so that
        # clients of several replicas keep an open transaction's calls here.
        assert statuses.now["svc.Txn"] == NOT_SERVING
        assert statuses.now[""] == SERVING
        assert statuses.now["svc.Control"] == SERVING
    finally:
        monitor.close()
