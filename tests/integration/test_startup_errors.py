"""``percolake serve`` with a flag it cannot honour fails before it touches the leader
lease, with one line naming the flag and exit code 2 (issue 31 item 5)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage_adapters import open_store
from tests.integration.test_grpc import _make_certs
from tso import LEADER_TABLE
from txn import TransactionManager

pytestmark = pytest.mark.integration

_EXIT_TIMEOUT_S = 60.0


@contextmanager
def _port_in_use() -> Iterator[int]:
    """A loopback port something listens on, for as long as the block runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def _leader_row(url: str) -> bytes | None:
    store = open_store(url)
    try:
        return store.get_system(LEADER_TABLE, [b"tso"]).get(b"tso")
    finally:
        store.close()


def _serve(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "percolake", "serve", "--store", url, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=_EXIT_TIMEOUT_S,
        cwd=tmp_path,
    )


def _mismatched_tls(tmp_path: Path) -> list[str]:
    _make_certs(tmp_path)
    # The client's key with the server's certificate: both files read fine.
    return [
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        str(tmp_path / "server.pem"),
        "--tls-key",
        str(tmp_path / "client.key"),
    ]


Case = tuple[str, Callable[[Path, int], list[str]]]
_CASES: list[Case] = [
    ("--tls-key", lambda tmp, port: _mismatched_tls(tmp)),
    ("--listen", lambda tmp, port: ["--listen", f"127.0.0.1:{port}"]),
    (
        "--metrics-listen",
        lambda tmp, port: ["--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}"],
    ),
]


@pytest.mark.parametrize(("flag", "arguments"), _CASES, ids=[flag for flag, _ in _CASES])
def test_a_bad_flag_fails_in_one_line_before_the_lease(
    tmp_path: Path, flag: str, arguments: Callable[[Path, int], list[str]]
) -> None:
    """A TLS key that does not match its certificate, a ``--listen`` port something
    else listens on, a ``--metrics-listen`` port in use: each is one line on stderr
    that begins with the flag, exit code 2, and the leader row as it was (the epoch of
    the last term, released, not bumped).

    Fails on the code before this fix: the TLS key and the port gave a
    ``RuntimeError: Failed to bind to address`` traceback (exit 1) that names neither
    cause, and with the metrics port taken the server first took the lease (a new
    epoch written to the row), announced it was serving, then died with a traceback.
    """
    url = f"sqlite:///{tmp_path / 'store.db'}"
    TransactionManager.embedded(url).close()  # a released row of epoch 1
    before = _leader_row(url)
    assert before is not None
    with _port_in_use() as port:
        result = _serve(tmp_path, url, *arguments(tmp_path, port))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"percolake serve: {flag} "), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert _leader_row(url) == before
