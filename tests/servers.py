"""Start real ``percolake serve`` processes for tests, on free loopback ports."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from percolake.tools.processes import stat_fields

READY_TIMEOUT_S = 30.0
#: :meth:`ServerProcess.stop` sends its second SIGTERM this long after the first.
_SECOND_SIGNAL_AFTER_S = 0.2


#: ``percolake serve``, and the chaos test build of it (the same arguments, plus the
#: test-only switches its environment variables turn on).
SERVE = ("percolake", "serve")
TEST_BUILD_SERVE = ("percolake.tools.chaos.serve",)


class ServerProcess:
    """One ``percolake serve`` subprocess; stopped by pid, never by name."""

    def __init__(
        self,
        role: str,
        args: Sequence[str],
        workdir: Path,
        env: dict[str, str] | None = None,
        *,
        command: Sequence[str] = SERVE,
    ) -> None:
        self.role = role
        self.command = list(command)
        self.args = list(args)
        self.workdir = workdir
        self.env = {**os.environ, **(env or {})}
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{role}-{time.monotonic_ns()}.log"

    def start(self, port: int | None = None) -> ServerProcess:
        """Start, on ``port`` if given (a restart keeps its address), else a free one."""
        ready = self.workdir / f"{self.role}-{time.monotonic_ns()}.ready"
        listen = f"127.0.0.1:{port if port is not None else 0}"
        command = [
            sys.executable,
            "-m",
            *self.command,
            self.role,
            "--listen",
            listen,
            "--ready-file",
            str(ready),
            "--grace-s",
            "5",
            *self.args,
        ]
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists() or not ready.read_text().strip():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.role} exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.role} not ready: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        self.port = int(ready.read_text())
        return self

    @property
    def address(self) -> str:
        assert self.port is not None
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, and again, then wait for a graceful exit; SIGKILL if it does not come.

        The second SIGTERM ends the drain at once (open transactions are aborted, calls
        in flight still finish, the lease is released), so a teardown does not wait
        ``--grace-s`` for transactions a test left open; tests of the drain itself
        send one signal (:meth:`signal`)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                # Apart, so the two are not merged into one pending signal.
                self.proc.wait(_SECOND_SIGNAL_AFTER_S)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def steered_server(
    role: str,
    args: Sequence[str],
    workdir: Path,
    lakehouse_control: Path | None = None,
) -> ServerProcess:
    """A server of the test build with its gateway fail points on
    (``percolake.tools.chaos.failpoints_serve``); ``lakehouse_control`` names the control
    file that steers the lakehouse service's group commits."""
    from percolake.tools.chaos.failpoints_serve import LAKEHOUSE_CONTROL_ENV, SERVE_FAILPOINTS_ENV

    env = {SERVE_FAILPOINTS_ENV: "1"}
    if lakehouse_control is not None:
        env[LAKEHOUSE_CONTROL_ENV] = str(lakehouse_control)
    return ServerProcess(role, args, workdir, env, command=TEST_BUILD_SERVE)


@contextmanager
def sqlite_write_locked(path: Path) -> Iterator[None]:
    """The SQLite store at ``path`` takes no writes while this holds its write lock: what
    a process stuck inside a write transaction, or a backup tool, does to it."""
    holder = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        holder.execute("BEGIN IMMEDIATE")
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def pause_outside_sqlite_writes(server: ServerProcess, path: Path, timeout_s: float = 10.0) -> None:
    """SIGSTOP ``server`` at a moment it is not inside a write transaction on the SQLite
    store at ``path``: the signal is sent, and seen taking effect, while this process
    holds the file's write lock.

    A process paused inside a write keeps that lock, and no other process can write
    until it resumes (docs/design/limits.md, "a paused leader"): a test that pauses a
    leader and resumes it only after the others took over must not pause it there.
    """
    with sqlite_write_locked(path):
        server.signal(signal.SIGSTOP)
        stat = Path(f"/proc/{server.pid}/stat")
        deadline = time.monotonic() + timeout_s
        while stat_fields(stat)[0] != "T":
            if time.monotonic() > deadline:
                raise AssertionError(f"pid {server.pid} not stopped {timeout_s:g} s after SIGSTOP")
            time.sleep(0.01)
