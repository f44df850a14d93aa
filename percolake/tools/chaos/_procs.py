"""The processes of a chaos run: servers and clients, each stopped by its own pid.

Every process the harness starts is recorded in ``pids.json`` in the run's work
folder while it runs, so that whoever cleans up after a harness that died can stop
exactly those processes and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
_PIDS_FILE = "pids.json"


class PidRegistry:
    """The pids this run started and that may still run, mirrored to a file."""

    def __init__(self, work_dir: Path) -> None:
        self._path = work_dir / _PIDS_FILE
        self._pids: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, pid: int, what: str) -> None:
        with self._lock:
            self._pids[pid] = what
            self._save()

    def remove(self, pid: int) -> None:
        with self._lock:
            self._pids.pop(pid, None)
            self._save()

    def _save(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(p): w for p, w in self._pids.items()}))
        tmp.replace(self._path)

    @staticmethod
    def kill_leftovers(work_dir: Path) -> list[int]:
        """SIGKILL the pids a dead harness left in its registry (after SIGCONT)."""
        path = work_dir / _PIDS_FILE
        try:
            pids = [int(p) for p in json.loads(path.read_text())]
        except (OSError, ValueError):
            return []
        killed = []
        for pid in pids:
            if not _is_ours(pid):
                continue  # exited since, and the pid may belong to someone else now
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                continue
        return killed


def _is_ours(pid: int) -> bool:
    """Whether ``pid`` still runs a percolake process (pids are reused)."""
    try:
        return b"percolake" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Managed:
    """One child process: started, signalled and reaped by pid."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        registry: PidRegistry,
        *,
        env: dict[str, str] | None = None,
        gid: int | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = log_path
        self.registry = registry
        self.env = env
        self.gid = gid
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.starts = 0

    def spawn(self, command: Sequence[str] | None = None) -> None:
        with self.log_path.open("ab") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                list(command or self.command),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                group=self.gid,
            )
        self.paused = False
        self.starts += 1
        self.registry.add(self.proc.pid, self.name)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL, as a crash: no clean-up at all."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.paused = False
        self.registry.remove(self.proc.pid)

    def request_stop(self) -> None:
        """SIGCONT (a paused process cannot act on SIGTERM), then SIGTERM; no wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGCONT (a paused process cannot act on SIGTERM), SIGTERM, then SIGKILL."""
        self.request_stop()
        return self.finish_stop(timeout_s)

    def finish_stop(self, timeout_s: float) -> int | None:
        """After :meth:`request_stop`: wait for the exit, SIGKILL after ``timeout_s``
        (one signal only: a second SIGTERM would cut a server's drain short)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM; killing it", self.name, self.proc.pid)
                self.proc.kill()
                self.proc.wait(30)
        self.paused = False
        self.registry.remove(self.proc.pid)
        return self.proc.returncode

    def wait(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self.registry.remove(self.proc.pid)
        return code

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Service(Managed):
    """A gRPC server started with ``--listen`` and ``--ready-file``; restarts keep the port."""

    def __init__(
        self,
        role: str,
        module: str,
        args: Sequence[str],
        work_dir: Path,
        registry: PidRegistry,
        *,
        env: dict[str, str] | None = None,
        gid: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(role, [], work_dir / f"{role}.log", registry, env=env, gid=gid)
        self.module = module
        self.args = list(args)
        self.work_dir = work_dir
        self.host = host
        self.port: int | None = None

    @property
    def address(self) -> str:
        assert self.port is not None, f"{self.name} never started"
        return f"{self.host}:{self.port}"

    def start(self) -> Service:
        """Start on the port of the previous start, or a free one the first time."""
        return self.await_ready(self.begin_start())

    def begin_start(self) -> Path:
        """Spawn the server; returns the ready file to pass to :meth:`await_ready`.

        Split in two so that servers that do not need each other's address start side
        by side (:func:`start_together`): each spends about a second importing.
        """
        ready = self.work_dir / f"{self.name}-{time.monotonic_ns()}.ready"
        command = [
            sys.executable,
            "-m",
            *self.module.split(),
            "--listen",
            f"{self.host}:{self.port or 0}",
            "--ready-file",
            str(ready),
            "--grace-s",
            "2",
            *self.args,
        ]
        self.spawn(command)
        return ready

    def await_ready(self, ready: Path) -> Service:
        """Wait until the server spawned by :meth:`begin_start` writes its port."""
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists() or not ready.read_text().strip():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited while starting: {self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} did not become ready: {self.tail()}")
            time.sleep(0.02)
        self.port = int(ready.read_text())
        ready.unlink()
        return self


def start_together(services: Sequence[Service]) -> list[Service]:
    """Spawn every server first, then wait for each to be ready: they import and start
    side by side. A server that fails to start ends the ones already spawned."""
    spawned: list[tuple[Service, Path]] = []
    try:
        for service in services:
            spawned.append((service, service.begin_start()))
        return [service.await_ready(ready) for service, ready in spawned]
    except BaseException:
        for service, _ in spawned:
            service.kill()
        raise


def stop_together(processes: Sequence[Managed | None], timeout_s: float = 15.0) -> None:
    """SIGTERM every process at once, then wait for each (SIGKILL after ``timeout_s``):
    their graceful stops (a drain, a collection pass finishing) overlap."""
    running = [p for p in processes if p is not None]
    for process in running:
        process.request_stop()
    deadline = time.monotonic() + timeout_s
    for process in running:
        process.finish_stop(max(0.0, deadline - time.monotonic()))
