"""CPU of this machine's processes, read from ``/proc``: for benchmarks that say where a
run's CPU went (the store's server processes, a gateway, writer processes)."""

from __future__ import annotations

import os
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def listening_pids(addresses: set[tuple[str, int]]) -> list[int]:
    """The pids of this machine's processes listening on any of ``addresses``
    (IPv4 ``(host, port)``), found through ``/proc/net/tcp`` and each process's fds."""
    inodes: set[str] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state != "0A":  # LISTEN
            continue
        hex_ip, hex_port = local.split(":")
        ip = ".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
        if (ip, int(hex_port, 16)) in addresses:
            inodes.add(f"socket:[{inode}]")
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
            if any(os.readlink(f"/proc/{entry.name}/fd/{fd}") in inodes for fd in fds):
                pids.append(int(entry.name))
        except OSError:  # exited, or not ours to read
            continue
    return sorted(pids)


#: How a HotSpot JVM names its JIT compiler threads ("C2 CompilerThread0", cut by
#: the kernel to 15 characters).
JIT_THREAD_PREFIXES = ("C1 CompilerThre", "C2 CompilerThre")


def _stat_cpu_s(stat: Path) -> float:
    raw = stat.read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far."""
    return sum(_stat_cpu_s(Path(f"/proc/{pid}/stat")) for pid in pids)


def jit_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds the JIT compiler threads of the JVMs ``pids`` have used so far (0 for
    a process without such threads). A JVM compiles its hot code for minutes after a
    start; while it does, this is a large part of its CPU (see :func:`cpu_seconds`)."""
    total = 0.0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                if task.joinpath("comm").read_text().startswith(JIT_THREAD_PREFIXES):
                    total += _stat_cpu_s(task / "stat")
            except OSError:  # the thread ended
                continue
    return total
