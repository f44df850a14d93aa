"""``grpc.health.v1.Health`` of a real ``percolake serve`` follows its ability to serve
(issue 31 item 1): NOT_SERVING while the store is unreachable, while no leader can be
had, and (for each service) while draining; SERVING again when it can serve; no token
needed, for the checks nor for the reflection tools such as ``grpcurl`` ask first."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.servers import ServerProcess, sqlite_write_locked
from txn import TransactionManager

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TXN = "percolake.v1.TransactionService"
TSO = "percolake.v1.TimestampService"
CONTROL = "percolake.v1.ControlService"
#: Bound of every wait for a status below (never a timing assertion).
_WAIT_S = 30.0
#: A short lease, so that a lease runs out, and a takeover happens, within a second.
LEASE = ["--leader-lease-ms", "500"]


def check(address: str, service: str = "") -> int:
    """The status ``service`` reports now, asked without any token."""
    with grpc.insecure_channel(address) as channel:
        got = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(got.status)


def wait_for(address: str, status: int, service: str = "") -> None:
    deadline = time.monotonic() + _WAIT_S
    while check(address, service) != status:
        if time.monotonic() > deadline:
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            raise AssertionError(f"{service or 'the server'} never became {name}")
        time.sleep(0.05)


def test_health_is_not_serving_while_the_store_cannot_be_written(tmp_path: Path) -> None:
    """The store stops taking writes (another connection holds SQLite's write lock):
    every service that needs it answers NOT_SERVING, the server as a whole too, with
    no token though ``--token-file`` is set; the control service (status) still
    answers; SERVING again once the store takes writes.

    Fails on the code before this fix: health said SERVING throughout (every ``Begin``
    then waited for a leader and failed), and it only changed at shutdown.
    """
    path = tmp_path / "store.db"
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    url = f"sqlite:///{path}?busy_timeout_ms=100"
    server = ServerProcess(
        "all", ["--store", url, "--token-file", str(token), *LEASE], tmp_path
    ).start()
    try:
        wait_for(server.address, SERVING)
        assert check(server.address, TXN) == SERVING
        with sqlite_write_locked(path):
            wait_for(server.address, NOT_SERVING)
            assert check(server.address, TXN) == NOT_SERVING
            assert check(server.address, TSO) == NOT_SERVING
            assert check(server.address, CONTROL) == SERVING
        wait_for(server.address, SERVING)
        wait_for(server.address, SERVING, TXN)
        client = TransactionManager.remote(server.address, token="s3cret")
        try:
            with client.begin() as tx:
                tx.put("t", b"r", b"c", b"after the outage")
        finally:
            client.close()
        assert "health: the server NOT_SERVING: store unreachable" in server.output()
        assert "health: the server SERVING again" in server.output()
    finally:
        server.stop()


def test_health_is_not_serving_beside_an_embedded_oracle_that_leads(tmp_path: Path) -> None:
    """A ``serve`` started beside an embedded manager that holds the lease can never
    forward to it: NOT_SERVING until the embedded manager closes, then the replica
    takes over and answers SERVING.

    Fails on the code before this fix: SERVING while every ``Begin`` failed after the
    wait for a leader.
    """
    url = f"sqlite:///{tmp_path / 'store.db'}"
    embedded = TransactionManager.embedded(url)
    server: ServerProcess | None = None
    try:
        server = ServerProcess("all", ["--store", url, *LEASE], tmp_path).start()
        wait_for(server.address, NOT_SERVING)
        assert check(server.address, TXN) == NOT_SERVING
        embedded.close()
        wait_for(server.address, SERVING)
        assert check(server.address, TXN) == SERVING
    finally:
        embedded.close()
        if server is not None:
            server.stop()


def test_each_service_is_not_serving_while_draining(tmp_path: Path) -> None:
    """SIGTERM: the transaction service answers NOT_SERVING at once (load balancers
    move away) while a transaction open before still commits; the server as a whole
    stays SERVING for that transaction's own client of several replicas.

    Fails on the code before this fix: every service answered SERVING until the port
    closed.
    """
    url = f"sqlite:///{tmp_path / 'store.db'}"
    server = ServerProcess("all", ["--store", url, "--grace-s", "20"], tmp_path).start()
    client = TransactionManager.remote(server.address, timeout_s=10)
    try:
        tx = client.begin()
        tx.put("t", b"r", b"c", b"v")
        assert check(server.address, TXN) == SERVING
        server.signal(signal.SIGTERM)
        wait_for(server.address, NOT_SERVING, TXN)
        assert check(server.address, TSO) == NOT_SERVING
        assert check(server.address, "") == SERVING
        assert tx.commit() > tx.start_ts
    finally:
        client.close()
    assert server.proc is not None
    assert server.proc.wait(_WAIT_S) == 0, server.output()[-3000:]


def test_health_and_reflection_need_no_token(tmp_path: Path) -> None:
    """With ``--token-file``, a probe asks health, and a tool like ``grpcurl`` asks
    reflection for the health service's schema, with no token.

    Fails on the code before this fix: reflection demanded the token, so ``grpcurl
    HOST:PORT grpc.health.v1.Health/Check`` failed as unauthenticated before it could
    send the check.
    """
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    server = ServerProcess(
        "all", ["--store", "memory://", "--token-file", str(token)], tmp_path
    ).start()
    try:
        assert check(server.address) == SERVING
        with grpc.insecure_channel(server.address) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="grpc.health.v1.Health"
            )
            (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
            assert answer.file_descriptor_response.file_descriptor_proto
    finally:
        server.stop()


def test_a_split_gateway_is_not_serving_while_its_oracle_is_down(tmp_path: Path) -> None:
    """``serve txn`` asks its oracle and lock server how they serve: NOT_SERVING while
    the ``serve`` it was given is killed, SERVING again once it is restarted.

    Fails on the code before this fix: the gateway answered SERVING throughout.
    """
    url = f"sqlite:///{tmp_path / 'store.db'}"
    oracle = ServerProcess("all", ["--store", url], tmp_path).start()
    gateway: ServerProcess | None = None
    try:
        upstream = ["--tso", oracle.address, "--locks", oracle.address]
        gateway = ServerProcess("txn", ["--store", url, *upstream], tmp_path).start()
        wait_for(gateway.address, SERVING, TXN)
        oracle.kill()
        wait_for(gateway.address, NOT_SERVING, TXN)
        assert check(gateway.address, "") == NOT_SERVING
        oracle.start(port=oracle.port)
        wait_for(gateway.address, SERVING, TXN)
        assert "tso at 127.0.0.1" in gateway.output()
    finally:
        if gateway is not None:
            gateway.stop()
        oracle.stop()
