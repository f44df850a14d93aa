"""Network faults inside the run's own network namespace: partitions and a slow network.

A chaos run that injects network faults runs every one of its processes inside a
namespace it creates (``ip netns add``), where the loopback interface is its own:
``iptables`` rules and ``tc`` queueing disciplines there touch nothing outside the run.
The namespace is deleted when the run ends.

Partitions are ``DROP`` rules in the ``OUTPUT`` chain (on loopback every packet is
locally generated): by port to cut a server off, by destination address to cut one
Cassandra node off, and by the sending process's group id (``-m owner --gid-owner``;
each process of the run gets a group of its own) to cut one gateway, client or
Cassandra node off from one server. Group ids are needed because every process here
connects from 127.0.0.1, Cassandra nodes to their peers included.

A slow network: this kernel has no ``netem`` (``CONFIG_NET_SCH_NETEM`` is not set, so
``tc qdisc add dev lo root netem delay ...`` fails with "Specified qdisc kind is
unknown"), so delay comes from a token bucket (``tbf``) on loopback that throttles
bandwidth and queues bursts, plus random packet loss (``-m statistic``) that makes TCP
wait out its retransmission timeouts (200 ms and up).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Final

log = logging.getLogger(__name__)

#: Comment on every rule this module adds, so that healing finds exactly those.
RULE_COMMENT: Final = "percolake-chaos"
#: Set for the harness inside its namespace: the namespace's name.
NAMESPACE_ENV: Final = "PERCOLAKE_CHAOS_NETNS"

Rule = tuple[str, ...]


class NetworkError(RuntimeError):
    """A namespace, rule or qdisc could not be set up; the message says why."""


def _run(command: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(command), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"$ {' '.join(command)}\n{(result.stdout + result.stderr).strip()}")
    return result


def current_namespace() -> str | None:
    """The name of the named namespace (``ip netns``) this process is in, if any."""
    if shutil.which("ip") is None:
        return None
    result = _run(["ip", "netns", "identify"], check=False)
    return result.stdout.strip() or None


def in_run_namespace() -> bool:
    """Whether this process is in the namespace its run created (``$NAMESPACE_ENV``)."""
    expected = os.environ.get(NAMESPACE_ENV)
    return bool(expected) and current_namespace() == expected


def namespace_support() -> str | None:
    """``None`` when this process can create namespaces and filter in them, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in ("ip", "iptables", "tc"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (apt-get install iproute2 iptables)"
    return None


def create_namespace(name: str) -> None:
    _run(["ip", "netns", "add", name])
    try:
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
    except NetworkError:
        delete_namespace(name)
        raise


def delete_namespace(name: str) -> None:
    result = _run(["ip", "netns", "del", name], check=False)
    if result.returncode != 0:
        log.warning("could not delete namespace %s: %s", name, result.stderr.strip())


def exec_prefix(name: str) -> list[str]:
    return ["ip", "netns", "exec", name]


class Network:
    """Partitions and slowness on the loopback of the run's private namespace."""

    def __init__(self) -> None:
        if not in_run_namespace():
            # Never touch the machine's own firewall or qdiscs.
            raise NetworkError("network faults run only inside the run's own namespace")
        self._active: list[Rule] = []
        self._slow = False

    def drop(self, rules: Sequence[Rule]) -> list[Rule]:
        """Add DROP rules (iptables match arguments, without chain and target)."""
        added: list[Rule] = []
        for rule in rules:
            _run(["iptables", "-w", "-A", "OUTPUT", *rule, *self._tail()])
            added.append(tuple(rule))
            self._active.append(tuple(rule))
        return added

    def undrop(self, rules: Sequence[Rule]) -> None:
        for rule in rules:
            if tuple(rule) in self._active:
                _run(["iptables", "-w", "-D", "OUTPUT", *rule, *self._tail()], check=False)
                self._active.remove(tuple(rule))

    def slow(self, rate_mbit: int, loss: float) -> None:
        _run(
            [
                "tc",
                "qdisc",
                "replace",
                "dev",
                "lo",
                "root",
                "tbf",
                "rate",
                f"{rate_mbit}mbit",
                "burst",
                "32kb",
                "latency",
                "200ms",
            ]
        )
        self._slow = True
        self.drop(
            [("-p", "tcp", "-m", "statistic", "--mode", "random", "--probability", f"{loss:.4f}")]
        )

    def unslow(self) -> None:
        if self._slow:
            _run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False)
            self._slow = False
        self.undrop([r for r in self._active if "statistic" in r])

    def heal_all(self) -> None:
        self.unslow()
        self.undrop(list(self._active))

    @staticmethod
    def _tail() -> list[str]:
        return ["-m", "comment", "--comment", RULE_COMMENT, "-j", "DROP"]


def port_rules(port: int) -> list[Rule]:
    """Everything to and from ``port``: the server on it is cut off from everyone."""
    return [("-p", "tcp", "--dport", str(port)), ("-p", "tcp", "--sport", str(port))]


def gid_to_port_rules(gid: int, port: int) -> list[Rule]:
    """Packets a process of group ``gid`` sends to ``port``: that one link is cut."""
    return [("-p", "tcp", "-m", "owner", "--gid-owner", str(gid), "--dport", str(port))]


def gid_rules(gid: int) -> list[Rule]:
    """Every packet a process of group ``gid`` sends: it is cut off from everything."""
    return [("-p", "tcp", "-m", "owner", "--gid-owner", str(gid))]


def address_port_rules(address: str, port: int) -> list[Rule]:
    """Connections to ``address:port`` (new and established)."""
    return [
        ("-p", "tcp", "-d", address, "--dport", str(port)),
        ("-p", "tcp", "-s", address, "--sport", str(port)),
    ]
