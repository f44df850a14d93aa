"""A real gateway process with the test-only fail points on, and the clients' side of them.

The gateway is ``python -m percolake.chaos.serve`` (exactly ``percolake serve`` plus
the test switches) with ``PERCOLAKE_TEST_SERVE_FAILPOINTS=1``; a test steers the fail
points of one transaction through an attached handle (see
:mod:`percolake.chaos.failpoints_serve`), so the transaction's own client calls stay
the public API, unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from percolake.chaos.failpoints_serve import CONTROL_TABLE, SERVE_FAILPOINTS_ENV
from txn.remote import RemoteTransaction, RemoteTransactionManager

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
CONTROL_COLUMN = b"v"


class FailpointGateway:
    """One gateway subprocess on a free loopback port; stopped by its pid only."""

    def __init__(
        self, workdir: Path, store_url: str = "memory://", extra_args: Sequence[str] = ()
    ) -> None:
        self.workdir = workdir
        self.store_url = store_url
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.log_path = workdir / f"gateway-{time.monotonic_ns()}.log"

    def start(self) -> FailpointGateway:
        ready = self.workdir / f"gateway-{time.monotonic_ns()}.ready"
        command = [
            sys.executable,
            "-m",
            "percolake.chaos.serve",
            "all",
            "--store",
            self.store_url,
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
            "--grace-s",
            "2",
            *self.extra_args,
        ]
        env = {**os.environ, SERVE_FAILPOINTS_ENV: "1"}
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists() or not ready.read_text().strip():
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.output()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gateway not ready: {self.output()[-2000:]}")
            time.sleep(0.02)
        self.port = int(ready.read_text())
        return self

    @property
    def address(self) -> str:
        assert self.port is not None
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to our own child, SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def steer(handle: RemoteTransaction, points: Mapping[bytes, bytes]) -> None:
    """Set fail points of ``handle``'s transaction (``handle`` is an attached one)."""
    assert handle.attached, "steer through an attached handle: it must not flush owner writes"
    for name, value in points.items():
        handle.put(CONTROL_TABLE, name, CONTROL_COLUMN, value)
    handle.flush()


def control_handle(manager: RemoteTransactionManager, txn_id: str) -> RemoteTransaction:
    """An attached handle that only ever carries fail point writes."""
    return manager.attach(txn_id)
