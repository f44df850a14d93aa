"""The gRPC services as real processes on loopback: faults, security, limits, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from percolake.tools.checker import check_history
from tests.servers import ServerProcess
from txn import Isolation, TransactionManager, TransactionStatus
from txn.errors import (
    CommitUnknownError,
    NotTransactionOwnerError,
    TransactionAbortedError,
    TransactionClosedError,
    TransactionLimitError,
    TransactionNotFoundError,
)
from txn.remote import RemoteTransactionManager
from wire.auth import TlsConfig
from wire.error_codes import ServiceUnavailableError, UnauthenticatedError
from wire.v1 import transaction_pb2 as pb
from wire.v1 import transaction_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway(tmp_path: Path):  # type: ignore[no-untyped-def]
    server = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/gw.db"], tmp_path).start()
    yield server
    server.stop()


def test_generated_code_has_not_drifted_from_the_protos() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- separate processes under faults ------------------------------------------------


def _list_append_client(
    address: str, process: int, keys: list[str], stop: threading.Event, history: list[dict]
) -> None:
    """Appends unique values to a few hot keys, recording Elle-style operations."""
    tm = TransactionManager.remote(address, timeout_s=10)
    n = 0
    try:
        while not stop.is_set():
            n += 1
            key = keys[n % len(keys)]
            value = process * 1_000_000 + n
            invoke = {
                "type": "invoke",
                "process": process,
                "f": "txn",
                "value": [["r", key, None], ["append", key, value]],
            }
            try:
                tx = tm.begin(Isolation.SERIALIZABLE)
            except (ServiceUnavailableError, TransactionAbortedError):
                time.sleep(0.05)  # the oracle is down: nothing was begun
                continue
            try:
                raw = tx.get("la", key.encode(), b"v")
                seen = [] if raw is None else json.loads(raw)
                tx.put("la", key.encode(), b"v", json.dumps([*seen, value]).encode())
                commit_ts = tx.commit()
            except TransactionAbortedError:
                history += [invoke, {**invoke, "type": "fail"}]
                continue
            except (CommitUnknownError, ServiceUnavailableError):
                history += [invoke, {**invoke, "type": "info"}]
                continue
            history += [
                invoke,
                {
                    **invoke,
                    "type": "ok",
                    "value": [["r", key, seen], ["append", key, value]],
                    "start_ts": tx.start_ts,
                    "commit_ts": commit_ts,
                },
            ]
    finally:
        tm.close()


def test_oracle_and_lock_server_restarts_under_load_cause_no_anomaly(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/data.db"
    tso = ServerProcess("tso", ["--store", f"sqlite:///{tmp_path}/tso.db"], tmp_path).start()
    locks = ServerProcess("locks", [], tmp_path).start()
    gw = ServerProcess(
        "txn", ["--store", store, "--tso", tso.address, "--locks", locks.address], tmp_path
    ).start()
    stop = threading.Event()
    histories: list[list[dict]] = [[] for _ in range(4)]
    clients = [
        threading.Thread(
            target=_list_append_client, args=(gw.address, p, ["a", "b"], stop, histories[p])
        )
        for p in range(4)
    ]
    try:
        for c in clients:
            c.start()
        for _ in range(2):
            time.sleep(1.0)
            tso.kill()  # SIGKILL: the unserved part of its window is lost, nothing else
            time.sleep(0.3)
            tso.start(port=tso.port)
            time.sleep(1.0)
            locks.kill()  # every lock is lost; the epoch changes
            time.sleep(0.3)
            locks.start(port=locks.port)
        time.sleep(1.0)
    finally:
        stop.set()
        for c in clients:
            c.join(30)
        gw.stop()
        locks.stop()
        tso.stop()
    ops = [dict(op, index=i) for i, op in enumerate(op for h in histories for op in h)]
    ok = [op for op in ops if op["type"] == "ok"]
    assert len(ok) > 20, "the workload made too little progress to mean anything"
    starts = [op["start_ts"] for op in ok]
    assert len(set(starts)) == len(starts), "a start timestamp was handed out twice"
    stamps = starts + [op["commit_ts"] for op in ok]
    assert len(set(stamps)) == len(stamps), "a timestamp was handed out twice"
    report = check_history(ops, "serializable")
    assert report.valid, report.render_text()


def test_attach_from_a_second_process_commits_atomically_with_the_first(gateway) -> None:  # type: ignore[no-untyped-def]
    tm = TransactionManager.remote(gateway.address)
    tx = tm.begin()
    tx.put("job", b"driver", b"c", b"1")
    tx.flush()  # type: ignore[attr-defined]
    child = f"""
from txn import TransactionManager
tm = TransactionManager.remote({gateway.address!r})
with tm.attach({tx.id!r}) as part:
    for i in range(50):
        part.put("job", f"task-{{i:02d}}".encode(), b"c", b"x")
part = tm.attach({tx.id!r})
try:
    part.commit()
except Exception as exc:
    print(type(exc).__name__)
"""
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "NotTransactionOwnerError"
    outsider = tm.begin()
    assert list(outsider.scan("job")) == []  # nothing visible before the driver commits
    assert len(list(tx.scan("job"))) == 51  # the driver sees the executors' writes
    tx.commit()
    assert len(list(tm.begin().scan("job"))) == 51
    with pytest.raises(TransactionClosedError):
        tm.attach(tx.id)
    tm.close()


def test_a_failed_task_leaves_nothing_in_the_shared_transaction(gateway) -> None:  # type: ignore[no-untyped-def]
    tm = TransactionManager.remote(gateway.address)
    tx = tm.begin()
    with pytest.raises(RuntimeError), tm.attach(tx.id) as part:
        part.put("job", b"half", b"c", b"x")
        raise RuntimeError("task failed")
    tx.put("job", b"driver", b"c", b"1")
    tx.commit()
    assert [r for r, _, _ in tm.begin().scan("job")] == [b"driver"]
    tm.close()


# --- security -------------------------------------------------------------------------


def test_missing_or_wrong_token_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    server = ServerProcess(
        "all",
        ["--store", f"sqlite:///{tmp_path}/s.db", "--token-file", str(token_file)],
        tmp_path,
        env={"PERCOLAKE_TOKEN": ""},
    ).start()
    try:
        for token in (None, "wrong"):
            anonymous = RemoteTransactionManager(server.address, token=token)
            with pytest.raises(UnauthenticatedError):
                anonymous.begin()
            channel = grpc.insecure_channel(server.address)
            stub = pb_grpc.TransactionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.Write(
                    pb.WriteRequest(
                        txn_id="1",
                        mutations=[pb.Mutation(table="t", row=b"r", column=b"c", put=b"v")],
                    )
                )
            assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
            channel.close()
            anonymous.close()
        trusted = TransactionManager.remote(server.address, token="s3cret-token")
        assert list(trusted.begin().scan("t")) == []
        with trusted.begin() as tx:
            tx.put("t", b"r", b"c", b"v")
        trusted.close()
        # Health checks need no token.
        channel = grpc.insecure_channel(server.address)
        health = health_pb2_grpc.HealthStub(channel)
        got = health.Check(health_pb2.HealthCheckRequest(service=""))
        assert got.status == health_pb2.HealthCheckResponse.SERVING
        channel.close()
    finally:
        server.stop()


def _make_certs(d: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=percolake-test-ca",
    )
    for name in ("server", "client"):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_client_certificates(tmp_path: Path) -> None:
    _make_certs(tmp_path)
    server = ServerProcess(
        "all",
        [
            "--store",
            "memory://",
            "--tls-cert",
            str(tmp_path / "server.pem"),
            "--tls-key",
            str(tmp_path / "server.key"),
            "--tls-client-ca",
            str(tmp_path / "ca.pem"),
        ],
        tmp_path,
    ).start()
    try:
        mutual = TlsConfig(
            cert_file=str(tmp_path / "client.pem"),
            key_file=str(tmp_path / "client.key"),
            ca_file=str(tmp_path / "ca.pem"),
        )
        tm = TransactionManager.remote(server.address, tls=mutual, timeout_s=5)
        with tm.begin() as tx:
            tx.put("t", b"r", b"c", b"over tls")
        assert tm.begin().get("t", b"r", b"c") == b"over tls"
        tm.close()
        no_cert = TransactionManager.remote(
            server.address, tls=TlsConfig(ca_file=str(tmp_path / "ca.pem")), timeout_s=5
        )
        with pytest.raises(ServiceUnavailableError):
            no_cert.begin()
        no_cert.close()
        plaintext = TransactionManager.remote(server.address, timeout_s=5)
        with pytest.raises(ServiceUnavailableError):
            plaintext.begin()
        plaintext.close()
    finally:
        server.stop()


# --- limits and bad input -------------------------------------------------------------


def test_bad_input_gets_clear_status_codes_and_the_server_stays_up(tmp_path: Path) -> None:
    server = ServerProcess(
        "all",
        ["--store", "memory://", "--max-message-mb", "1", "--max-writes-per-txn", "10"],
        tmp_path,
    ).start()
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.TransactionServiceStub(channel)
    tm = TransactionManager.remote(server.address)
    try:

        def code_of(fn, request) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
            with pytest.raises(grpc.RpcError) as info:
                fn(request)
            return info.value.code()  # type: ignore[no-any-return]

        assert code_of(stub.Begin, pb.BeginRequest(isolation=7)) is grpc.StatusCode.INVALID_ARGUMENT
        assert (
            code_of(stub.Get, pb.GetRequest(txn_id="424242", table="t", row=b"r", column=b"c"))
            is grpc.StatusCode.NOT_FOUND
        )
        assert (
            code_of(stub.Get, pb.GetRequest(txn_id="not-an-id", table="t", row=b"r", column=b"c"))
            is grpc.StatusCode.NOT_FOUND
        )
        begun = stub.Begin(pb.BeginRequest())
        bad_table = pb.WriteRequest(
            txn_id=begun.txn_id,
            mutations=[
                pb.Mutation(table="t", row=b"ok", column=b"c", put=b"v"),
                pb.Mutation(table="bad table!", row=b"r", column=b"c", put=b"v"),
            ],
        )
        assert code_of(stub.Write, bad_table) is grpc.StatusCode.INVALID_ARGUMENT
        no_kind = pb.WriteRequest(
            txn_id=begun.txn_id, mutations=[pb.Mutation(table="t", row=b"r", column=b"c")]
        )
        assert code_of(stub.Write, no_kind) is grpc.StatusCode.INVALID_ARGUMENT
        empty_row = pb.GetRequest(txn_id=begun.txn_id, table="t", row=b"", column=b"c")
        assert code_of(stub.Get, empty_row) is grpc.StatusCode.INVALID_ARGUMENT
        # All-or-nothing: the valid first mutation of the refused request was not buffered.
        got = stub.Get(pb.GetRequest(txn_id=begun.txn_id, table="t", row=b"ok", column=b"c"))
        assert not got.found
        wrong_secret = pb.CommitRequest(txn_id=begun.txn_id, commit_secret="guess")
        assert code_of(stub.Commit, wrong_secret) is grpc.StatusCode.FAILED_PRECONDITION
        stub.Commit(pb.CommitRequest(txn_id=begun.txn_id, commit_secret=begun.commit_secret))
        after = pb.GetRequest(txn_id=begun.txn_id, table="t", row=b"r", column=b"c")
        assert code_of(stub.Get, after) is grpc.StatusCode.FAILED_PRECONDITION

        tx = tm.begin()
        tx.put("t", b"big", b"c", b"x" * (2 * 1024 * 1024))
        with pytest.raises(Exception) as big:
            tx.flush()  # type: ignore[attr-defined]
        assert "RESOURCE_EXHAUSTED" in repr(big.value) or "larger than max" in str(big.value)
        many = tm.begin()
        for i in range(11):
            many.put("t", f"r{i}".encode(), b"c", b"v")
        with pytest.raises(TransactionLimitError):
            many.commit()
        garbage = channel.unary_unary(
            "/percolake.v1.TransactionService/Begin",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError):
            garbage(b"\xff\xff\xff\xff not a protobuf")
        with pytest.raises(TransactionNotFoundError):
            tm.attach("99999999")
        # Still serving, and nothing of the refused calls is visible.
        with tm.begin() as ok:
            ok.put("t", b"fine", b"c", b"1")
        assert [r for r, _, _ in tm.begin().scan("t")] == [b"fine"]
    finally:
        tm.close()
        channel.close()
        server.stop()


def test_idle_transactions_are_aborted(tmp_path: Path) -> None:
    server = ServerProcess(
        "all", ["--store", "memory://", "--idle-timeout-s", "0.3"], tmp_path
    ).start()
    """Every later call of a transaction the gateway aborted as idle says so, as
    TransactionAbortedError (nothing committed). Fails before issue 31: a read, and a
    commit whose buffered writes were flushed first, raised TransactionClosedError
    ("transaction ... is aborted"), and a bare Commit a generic "settled by another
    client, or idle too long"."""
    tm = TransactionManager.remote(server.address)
    try:
        tx = tm.begin()
        tx.put("t", b"r", b"c", b"v")
        tx.flush()  # type: ignore[attr-defined]
        flushed = tm.begin()
        flushed.put("t", b"f", b"c", b"v")
        flushed.flush()  # type: ignore[attr-defined]
        buffered = tm.begin()
        buffered.put("t", b"b", b"c", b"v")  # sent only by commit's flush
        time.sleep(2.5)
        with pytest.raises(TransactionAbortedError, match="aborted by the gateway: idle"):
            tx.get("t", b"r", b"c")
        for late in (flushed, buffered):
            with pytest.raises(TransactionAbortedError, match="aborted by the gateway: idle"):
                late.commit()
            assert late.status is TransactionStatus.ABORTED
        assert tm.begin().get("t", b"f", b"c") is None
        assert "idle" in server.output()
    finally:
        tm.close()
        server.stop()


def test_sigterm_lets_an_in_flight_commit_finish(tmp_path: Path) -> None:
    server = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/s.db"], tmp_path).start()
    tm = TransactionManager.remote(server.address)
    idle = tm.begin()
    idle.put("t", b"idle", b"c", b"v")
    idle.flush()  # type: ignore[attr-defined]
    big = tm.begin()
    for i in range(20_000):
        big.put("t", f"row{i:06d}".encode(), b"c", b"v")
    big.flush()  # type: ignore[attr-defined]
    outcome: list[object] = []
    committer = threading.Thread(target=lambda: outcome.append(big.commit()))
    committer.start()
    time.sleep(0.05)
    server.signal(signal.SIGTERM)
    committer.join(60)
    assert server.proc is not None and server.proc.wait(60) == 0
    assert isinstance(outcome[0], int)  # finished, not cut off
    log = server.output()
    assert "stopped" in log and "aborted 1 open transactions" in log
    tm.close()
    restarted = ServerProcess("all", ["--store", f"sqlite:///{tmp_path}/s.db"], tmp_path).start()
    again = TransactionManager.remote(restarted.address)
    rows = [r for r, _, _ in again.begin().scan("t")]
    assert len(rows) == 20_000 and b"idle" not in rows
    again.close()
    restarted.stop()


def test_gateway_killed_mid_commit_is_settled_all_or_nothing(tmp_path: Path) -> None:
    """SIGKILL the gateway while it commits: the client never retries blindly (S6), and
    the outcome, settled later through another gateway, is all of the rows or none."""
    store = f"sqlite:///{tmp_path}/s.db"
    server = ServerProcess("all", ["--store", store], tmp_path).start()
    tm = TransactionManager.remote(server.address, timeout_s=5)
    big = tm.begin()
    for i in range(20_000):
        big.put("t", f"row{i:06d}".encode(), b"c", b"v")
    big.flush()  # type: ignore[attr-defined]
    outcome: list[object] = []

    def commit() -> None:
        try:
            outcome.append(big.commit())
        except (CommitUnknownError, TransactionAbortedError) as exc:
            outcome.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    time.sleep(0.1)
    server.kill()
    committer.join(60)
    tm.close()
    restarted = ServerProcess("all", ["--store", store], tmp_path).start()
    try:
        again = TransactionManager.remote(restarted.address)
        settled = again.outcome(big.id, settle=True)  # type: ignore[attr-defined]
        rows = len(list(again.begin().scan("t")))
        from txn import TransactionStatus

        assert settled in (TransactionStatus.COMMITTED, TransactionStatus.ABORTED)
        assert rows == (20_000 if settled is TransactionStatus.COMMITTED else 0)
        if isinstance(outcome[0], int):
            assert settled is TransactionStatus.COMMITTED
        elif isinstance(outcome[0], TransactionAbortedError):
            assert settled is TransactionStatus.ABORTED
        assert again.outcome(big.id) is settled  # type: ignore[attr-defined]
        again.close()
    finally:
        restarted.stop()


# --- a client written by someone else ---------------------------------------------------


def _grpcurl() -> str | None:
    candidates = [
        os.environ.get("PERCOLAKE_GRPCURL", ""),
        str(Path.home() / ".cache" / "percolake" / "bin" / "grpcurl"),
        shutil.which("grpcurl") or "",
    ]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@pytest.mark.skipif(_grpcurl() is None, reason="grpcurl could not be installed (make tools)")
def test_grpcurl_lists_services_and_commits_a_transaction(gateway) -> None:  # type: ignore[no-untyped-def]
    grpcurl = _grpcurl()
    assert grpcurl is not None

    def run(*args: str, data: dict | None = None) -> str:
        command = [grpcurl, "-plaintext"]
        if data is not None:
            command += ["-d", json.dumps(data)]
        result = subprocess.run(
            [*command, gateway.address, *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return result.stdout

    services = run("list").split()
    for name in (
        "percolake.v1.TransactionService",
        "percolake.v1.TimestampService",
        "percolake.v1.LockService",
        "grpc.health.v1.Health",
    ):
        assert name in services
    begun = json.loads(
        run("percolake.v1.TransactionService/Begin", data={"isolation": "ISOLATION_SERIALIZABLE"})
    )
    # grpcurl prints proto field names; accept the JSON camelCase spelling as well.
    begun = {k.replace("_", "").lower(): v for k, v in begun.items()}
    import base64

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    run(
        "percolake.v1.TransactionService/Write",
        data={
            "txn_id": begun["txnid"],
            "mutations": [
                {"table": "t", "row": b64(b"from"), "column": b64(b"c"), "put": b64(b"grpcurl")}
            ],
        },
    )
    committed = json.loads(
        run(
            "percolake.v1.TransactionService/Commit",
            data={
                "txn_id": begun["txnid"],
                "commit_secret": begun["commitsecret"],
            },
        )
    )
    committed = {k.replace("_", "").lower(): v for k, v in committed.items()}
    assert int(committed["committs"]) > int(begun["startts"])
    tm = TransactionManager.remote(gateway.address)
    assert tm.begin().get("t", b"from", b"c") == b"grpcurl"
    tm.close()


def test_abort_and_context_manager_through_the_gateway(gateway) -> None:  # type: ignore[no-untyped-def]
    tm = TransactionManager.remote(gateway.address)
    with pytest.raises(KeyError), tm.begin() as tx:
        tx.put("t", b"r", b"c", b"v")
        raise KeyError("job failed")
    assert tm.begin().get("t", b"r", b"c") is None
    part = tm.attach(tm.begin().id)
    with pytest.raises(NotTransactionOwnerError):
        part.abort()
    assert tm.run(lambda t: t.get("t", b"r", b"c")) is None
    tm.close()


def test_serve_refuses_bad_protocol_timeouts_before_listening(tmp_path: Path) -> None:
    for flag, value, words in (
        ("--lease-ms", "0", "lease_ms must be positive, got 0"),
        ("--lock-wait-ms", "-5", "lock_wait_ms must be positive, got -5"),
        ("--resolve-wait-ms", "soon", "invalid int value: 'soon'"),
        ("--leader-wait-s", "0", "--leader-wait-s must be in (0, 300], got 0.0"),
        ("--leader-wait-s", "nan", "--leader-wait-s must be in (0, 300], got nan"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "percolake", "serve", "--store", "memory://", flag, value],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert result.returncode == 2, (flag, result.stderr)
        assert words in result.stderr, (flag, result.stderr)
        assert not (tmp_path / ".percolake").exists()
