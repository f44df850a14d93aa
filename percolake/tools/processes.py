"""What the server launchers (``percolake cassandra``, ``percolake s3``) share: spawning a
server that outlives its caller, signalling and reaping it by pid, reading its state
from ``/proc``, a file lock for fetches and builds that clones and pytest-xdist workers
share, and log tails."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def spawn(
    command: Sequence[str], output: Path, env: Mapping[str, str] | None = None, mode: int = 0o644
) -> int:
    """Start ``command`` in a new session with stdout and stderr appended to ``output``.

    A new session: the server outlives a CLI that started it and does not get the
    terminal's Ctrl-C; it is stopped by pid instead. ``posix_spawn`` rather than
    ``Popen``, whose object would warn when collected while the server runs on.
    ``mode`` is the log's, when it is created (0o600 for a log that may show secrets).
    """
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    try:
        return os.posix_spawn(
            command[0],
            list(command),
            dict(os.environ if env is None else env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(fd)


def child_running(pid: int) -> bool:
    """Whether a child of this process still runs; reaps it once it has exited."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # already reaped
        return False
    return done == 0


def send_signal(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid``; a process that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stat_fields(stat: Path) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` (or ``/proc/<pid>/task/<tid>/stat``) after
    the command name, which may hold spaces and parentheses: [0] is the state (``R``,
    ``S``, ``T`` stopped, ``Z`` zombie, ...). Raises ``OSError`` once the process is gone."""
    return stat.read_text().rsplit(")", 1)[-1].split()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing) for the block."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def since(started: float) -> float:
    return time.monotonic() - started
