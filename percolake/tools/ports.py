"""Free loopback ports for the servers percolake's tools and tests start.

A port found free by binding port 0 is free only until someone else takes it: a
Cassandra node binds its CQL port ~15 s after its launcher chose it, and another
process choosing in that window could get the same port from the kernel (CI run of
stop 40: a MinIO console in one test worker took the port a Cassandra node in the
other worker had been given, and every test of that node failed). So a port is
handed out here only

- below the kernel's ephemeral range (``ip_local_port_range``), where no outgoing
  connection is ever given a source port, and
- with a claim: a file per port in one directory shared by every process of this
  user, taken under a lock, that no other caller of :func:`free_ports` passes over
  for ``CLAIM_TTL_S`` (time enough for the slowest server to bind it).

Ports chosen by a kernel bind of port 0 at listen time (``--metrics-port 0``) need
none of this: they are bound as they are chosen.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from percolake.tools.processes import file_lock

#: How long a claim keeps a port from other callers. Servers bind well within it; a
#: server that is still running afterwards holds its port, so the bind check skips it.
CLAIM_TTL_S = 600.0

#: The lowest port handed out (clear of the well-known and registered ports most
#: services default to, such as 9042, 7000 and 9000).
LOWEST_PORT = 20000

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_ATTEMPTS = 1000
_rng = random.SystemRandom()


def claims_dir() -> Path:
    """The directory of claims, shared by every process of this user."""
    return Path(tempfile.gettempdir()) / f"percolake-ports-{os.getuid()}"


def candidate_ports() -> range:
    """The ports handed out: below the ephemeral range if it leaves room, else above."""
    try:
        low, high = (int(field) for field in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    if low - LOWEST_PORT >= 1000:
        return range(LOWEST_PORT, low)
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    return range(LOWEST_PORT, 65536)


def free_ports(count: int, *, hosts: Sequence[str] = ("127.0.0.1",), span: int = 1) -> list[int]:
    """``count`` distinct ports that nothing listens on at any of ``hosts``, claimed
    for this caller.

    With ``span`` > 1 each returned port ``p`` comes with ``p + 1`` .. ``p + span - 1``
    free and claimed too (a cluster whose node ``i`` listens on ``p + i - 1``).
    """
    if count < 1 or span < 1:
        raise ValueError(f"count and span must be at least 1, got {count} and {span}")
    candidates = candidate_ports()
    directory = claims_dir()
    directory.mkdir(mode=0o700, exist_ok=True)
    firsts: list[int] = []
    taken: set[int] = set()
    with file_lock(directory / ".lock"):
        now = time.time()
        for _ in range(_ATTEMPTS):
            first = _rng.randrange(candidates.start, candidates.stop - span + 1)
            block = range(first, first + span)
            if any(p in taken or _claimed(directory, p, now) for p in block):
                continue
            if not all(_bindable(host, p) for host in hosts for p in block):
                continue
            for port in block:
                (directory / str(port)).write_text(f"{os.getpid()}\n")
            taken.update(block)
            firsts.append(first)
            if len(firsts) == count:
                return firsts
    raise OSError(
        f"no {count} free port(s) found on {', '.join(hosts)} in "
        f"{candidates.start}-{candidates.stop - 1} after {_ATTEMPTS} tries"
    )


def _claimed(directory: Path, port: int, now: float) -> bool:
    try:
        return now - (directory / str(port)).stat().st_mtime < CLAIM_TTL_S
    except FileNotFoundError:
        return False


def _bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (no ``SO_REUSEADDR``: a port
    still in TIME_WAIT counts as taken, which is stricter than any server needs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
