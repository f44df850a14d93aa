"""``percolake status`` against a real ``percolake serve`` that requires a token and
client certificates (issue 31, item 5): it reaches the server with ``--token-file``,
``--tls-ca``, ``--tls-cert`` and ``--tls-key``, and says why when it cannot."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_grpc import _make_certs
from tests.servers import ServerProcess

pytestmark = pytest.mark.integration

TOKEN = "status-probe-token"
STATUS = (sys.executable, "-m", "percolake", "status")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    d = tmp_path_factory.mktemp("secured")
    _make_certs(d)
    (d / "token").write_text(TOKEN + "\n")
    server = ServerProcess(
        "all",
        [
            "--store",
            "memory://",
            "--token-file",
            str(d / "token"),
            "--tls-cert",
            str(d / "server.pem"),
            "--tls-key",
            str(d / "server.key"),
            "--tls-client-ca",
            str(d / "ca.pem"),
        ],
        d,
    ).start()
    yield server, d
    server.stop()


def _status(address: str, *flags: str) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run(
        [*STATUS, "--gateway", address, "--json", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PERCOLAKE_TOKEN"},
    )
    return done.returncode, json.loads(done.stdout) if done.returncode != 2 else [], done.stderr


def test_status_reaches_a_server_that_requires_a_token_and_client_certificates(
    secured: tuple[ServerProcess, Path],
) -> None:
    """Fails before issue 31: status had no --tls-cert/--tls-key (exit 2, unknown
    arguments), so no client certificate could be shown to the server."""
    server, d = secured
    tls = ["--tls-ca", str(d / "ca.pem"), "--tls-cert", str(d / "client.pem")]
    tls += ["--tls-key", str(d / "client.key")]
    code, answers, err = _status(server.address, "--token-file", str(d / "token"), *tls)
    assert code == 0, (answers, err)
    (answer,) = answers
    assert answer["state"] == "ok" and answer["error"] is None
    assert answer["leases"][0]["leading"] is True


def test_status_tells_unauthenticated_from_unreachable(
    secured: tuple[ServerProcess, Path],
) -> None:
    """A refused token is 'unauthenticated', a connection the server closes because no
    client certificate was shown is 'tls-failed' with the flags to give, a port nobody
    listens on is 'unreachable'. Fails before issue 31: every failure was 'unreachable'."""
    server, d = secured
    tls = ["--tls-ca", str(d / "ca.pem"), "--tls-cert", str(d / "client.pem")]
    tls += ["--tls-key", str(d / "client.key")]

    code, (answer,), _ = _status(server.address, *tls)  # no token
    assert code == 1 and answer["state"] == "unauthenticated", answer
    assert "--token-file" in answer["error"]

    code, (answer,), _ = _status(
        server.address, "--token-file", str(d / "token"), "--tls-ca", str(d / "ca.pem")
    )
    assert code == 1 and answer["state"] == "tls-failed", answer
    assert "--tls-cert" in answer["error"]

    (d / "wrong").write_text("not-the-token\n")
    done = subprocess.run(
        [*STATUS, "--gateway", server.address, "--token-file", str(d / "wrong"), *tls],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"{server.address}: unauthenticated: UnauthenticatedError" in done.stdout
    assert "unreachable" not in done.stdout

    with socket.socket() as free:  # a port nobody listens on once closed
        free.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{free.getsockname()[1]}"
    code, (answer,), _ = _status(address, "--timeout-s", "2")
    assert code == 1 and answer["state"] == "unreachable", answer
