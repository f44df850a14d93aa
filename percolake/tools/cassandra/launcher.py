"""Run a real Apache Cassandra from Maven Central artifacts, without Docker or tarballs.

``ensure_jars`` fetches ``org.apache.cassandra:cassandra-all`` and its runtime
dependencies with ``mvn`` into a cache folder shared by every clone on the machine
(``~/.cache/percolake/cassandra``, or ``$PERCOLAKE_CASSANDRA_HOME``).
:class:`CassandraCluster` writes one ``cassandra.yaml`` per node and starts
``java ... org.apache.cassandra.service.CassandraDaemon`` on 127.0.0.1, 127.0.0.2, ...
Everything a later process needs to stop or inspect the nodes (the cluster layout
and each node's pid) is kept in files under the cluster directory, so
``percolake cassandra stop --dir DIR`` works from any process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from percolake.tools.ports import free_ports
from percolake.tools.processes import (
    child_running,
    file_lock,
    send_signal,
    since,
    spawn,
    stat_fields,
    tail,
)
from wire.errors import PercolakeError

log = logging.getLogger(__name__)

#: The Cassandra release fetched when none is asked for (a 5.0.x from Maven Central).
DEFAULT_VERSION = "5.0.9"

#: Where the jars are cached unless ``$PERCOLAKE_CASSANDRA_HOME`` says otherwise.
DEFAULT_HOME = Path("~/.cache/percolake/cassandra")

#: Where ``percolake cassandra start`` keeps its nodes unless ``--dir`` says otherwise.
DEFAULT_CLUSTER_DIR = Path(".percolake/cassandra")

_STATE_FILE = "cluster.json"
_PID_FILE = "cassandra.pid"
_COMPLETE_MARKER = ".complete"

# Murmur3 tokens spaced evenly over the ring, so that n nodes own equal shares
# without vnodes (num_tokens: 1 keeps startup and repair fast for tests).
_MIN_TOKEN = -(1 << 63)
_RING_SIZE = 1 << 64

# From Cassandra's conf/jvm17-server.options: the modules Cassandra reflects into.
_JVM17_MODULE_FLAGS = (
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports=java.sql/java.sql=ALL-UNNAMED",
    "--add-exports=java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports=jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
)

_JVM_GC_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:+ParallelRefProcEnabled",
    "-XX:MaxTenuringThreshold=1",
    "-XX:G1HeapRegionSize=16m",
    "-XX:G1RSetUpdatingPauseTimePercent=5",
    "-XX:MaxGCPauseMillis=300",
    "-XX:InitiatingHeapOccupancyPercent=70",
    # A node that ran out of memory may have lost writes it acknowledged: die loudly.
    "-XX:+ExitOnOutOfMemoryError",
)

# Properties that cut a fresh node's start from ~40 s to a few seconds. They only skip
# waits that matter when joining a long-lived ring, which a test cluster never does.
_FAST_START_PROPERTIES = {
    "cassandra.skip_wait_for_gossip_to_settle": "0",
    "cassandra.ring_delay_ms": "1000",
    "cassandra.superuser_setup_delay_ms": "0",
    "cassandra.load_ring_state": "false",
    "cassandra.shutdown_announce_in_ms": "500",
}

_LOGBACK_XML = """<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">
    <file>{log_dir}/system.log</file>
    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">
      <fileNamePattern>{log_dir}/system.log.%i</fileNamePattern>
      <minIndex>1</minIndex>
      <maxIndex>3</maxIndex>
    </rollingPolicy>
    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">
      <maxFileSize>20MB</maxFileSize>
    </triggeringPolicy>
    <encoder>
      <pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern>
    </encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="FILE"/>
  </root>
</configuration>
"""


class CassandraError(PercolakeError, RuntimeError):
    """Cassandra could not be fetched, started or stopped; the message says why."""


class CassandraPortTaken(CassandraError):
    """A node exited during startup because one of its ports was taken after the
    launcher checked it (by a process that bound it in between)."""


#: What a node's log says when a port it binds is taken (netty's errno 98).
_BIND_FAILURES = ("Address already in use", "Failed to bind port")


# --- jars ---------------------------------------------------------------------------


def cassandra_home() -> Path:
    """The jar cache: ``$PERCOLAKE_CASSANDRA_HOME`` or ``~/.cache/percolake/cassandra``."""
    configured = os.environ.get("PERCOLAKE_CASSANDRA_HOME")
    return Path(configured).expanduser() if configured else DEFAULT_HOME.expanduser()


def lib_dir(version: str = DEFAULT_VERSION, home: Path | None = None) -> Path:
    """Where the jars of one Cassandra version live inside the cache."""
    return (home or cassandra_home()) / version / "lib"


def jars_present(version: str = DEFAULT_VERSION, home: Path | None = None) -> bool:
    return (lib_dir(version, home) / _COMPLETE_MARKER).is_file()


def ensure_jars(
    version: str = DEFAULT_VERSION, home: Path | None = None, *, mvn: str = "mvn"
) -> Path:
    """Return the folder holding the jars of ``version``, fetching them first if needed.

    Safe to call from several processes at once: a file lock serialises fetches, and a
    marker written last means a half-finished fetch is never mistaken for a cache.
    """
    home = home or cassandra_home()
    target = lib_dir(version, home)
    if jars_present(version, home):
        return target
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(home / "fetch.lock"):
        if jars_present(version, home):  # another process fetched while we waited
            return target
        if shutil.which(mvn) is None:
            raise CassandraError(f"cannot fetch Cassandra {version}: {mvn!r} is not on PATH")
        staging = target.with_name("lib.partial")
        shutil.rmtree(staging, ignore_errors=True)
        pom = Path(__file__).with_name("pom.xml")
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            f"-Dcassandra.version={version}",
            f"-Dmaven.repo.local={home / 'm2'}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        log.info("fetching Cassandra %s from Maven Central into %s", version, target)
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise CassandraError(
                f"mvn failed (exit {result.returncode}) fetching Cassandra {version}:\n"
                f"$ {' '.join(command)}\n{tail(result.stdout + result.stderr, 40)}"
            )
        if not any(staging.glob(f"cassandra-all-{version}.jar")):
            raise CassandraError(
                f"mvn finished but cassandra-all-{version}.jar is not in {staging}"
            )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        (target / _COMPLETE_MARKER).write_text(f"{version}\n")
        log.info("fetched %d jars in %.1f s", len(list(target.glob("*.jar"))), since(started))
    return target


# --- java ---------------------------------------------------------------------------


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` when set, else ``java`` on ``PATH``; it must be Java 17."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    java = str(Path(java).absolute()) if java else None
    if not java or not Path(java).exists():
        raise CassandraError("no java found: install OpenJDK 17 or set JAVA_HOME")
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    found = re.search(r'version "(\d+)', result.stderr)
    major = int(found.group(1)) if found else 0
    if major != 17:
        raise CassandraError(
            f"{java} is Java {major or 'of unknown version'}; these Cassandra flags are for "
            "Java 17 (set JAVA_HOME to a JDK 17)"
        )
    return java


# --- cluster ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """What ``CassandraCluster.status`` found about one node."""

    index: int
    address: str
    pid: int | None
    process_alive: bool
    cql_ready: bool
    directory: Path


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """Everything needed to find a cluster's nodes again; saved as ``cluster.json``."""

    nodes: int
    base_dir: Path
    version: str = DEFAULT_VERSION
    cluster_name: str = "percolake"
    native_transport_port: int = 9042
    storage_port: int = 7000
    jmx_port: int = 7199  # node i listens on jmx_port + i - 1 (JMX binds 127.0.0.1 only)
    first_address: int = 1  # node i listens on 127.0.0.(first_address + i - 1)
    heap_mb: int = 1024
    extra_yaml: Mapping[str, Any] = field(default_factory=dict)

    def address(self, index: int) -> str:
        return f"127.0.0.{self.first_address + index - 1}"

    def node_dir(self, index: int) -> Path:
        return self.base_dir / f"node{index}"

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["base_dir"] = str(self.base_dir)
        data["extra_yaml"] = dict(self.extra_yaml)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterLayout:
        data = json.loads(text)
        data["base_dir"] = Path(data["base_dir"])
        return cls(**data)


class CassandraCluster:
    """One or more Cassandra nodes on this machine's loopback addresses.

    ``CassandraCluster(nodes=3, base_dir=d).start()`` runs nodes on 127.0.0.1-3, each
    with its own directory, ``cassandra.yaml`` and JMX port; 127.0.0.1 is the seed.
    ``start`` returns once every node answers CQL and sees the others. Use it as a
    context manager to stop the nodes on exit.
    """

    def __init__(
        self,
        nodes: int = 1,
        base_dir: str | os.PathLike[str] = DEFAULT_CLUSTER_DIR,
        *,
        version: str = DEFAULT_VERSION,
        cluster_name: str = "percolake",
        native_transport_port: int = 9042,
        storage_port: int = 7000,
        jmx_port: int = 7199,
        first_address: int = 1,
        heap_mb: int = 1024,
        extra_yaml: Mapping[str, Any] | None = None,
        home: Path | None = None,
        startup_timeout_s: float = 240.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        if not 1 <= nodes <= 9:
            raise ValueError(f"nodes must be between 1 and 9, got {nodes}")
        if not 1 <= first_address <= 254 - nodes:
            raise ValueError(f"first_address must leave room for {nodes} nodes in 127.0.0.x")
        self.layout = ClusterLayout(
            nodes=nodes,
            base_dir=Path(base_dir).absolute(),
            version=version,
            cluster_name=cluster_name,
            native_transport_port=native_transport_port,
            storage_port=storage_port,
            jmx_port=jmx_port,
            first_address=first_address,
            heap_mb=heap_mb,
            extra_yaml=dict(extra_yaml or {}),
        )
        self._home = home
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._children: dict[int, int] = {}  # node index -> pid, for nodes this object spawned

    @classmethod
    def from_dir(cls, base_dir: str | os.PathLike[str]) -> CassandraCluster:
        """The cluster a previous ``start`` left in ``base_dir`` (reads ``cluster.json``)."""
        state = Path(base_dir).absolute() / _STATE_FILE
        if not state.is_file():
            raise CassandraError(f"no cluster in {state.parent} (missing {_STATE_FILE})")
        layout = ClusterLayout.from_json(state.read_text())
        cluster = cls(layout.nodes, layout.base_dir)
        cluster.layout = layout
        return cluster

    # --- addresses --------------------------------------------------------------

    @property
    def contact_points(self) -> list[str]:
        return [self.layout.address(i) for i in self._indexes()]

    @property
    def port(self) -> int:
        """The CQL (native transport) port every node listens on."""
        return self.layout.native_transport_port

    def store_url(self, keyspace: str, **options: object) -> str:
        """A ``cassandra://`` URL for a keyspace on this cluster."""
        hosts = ",".join(f"{a}:{self.port}" for a in self.contact_points)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"cassandra://{hosts}/{keyspace}" + (f"?{query}" if query else "")

    def _indexes(self) -> range:
        return range(1, self.layout.nodes + 1)

    # --- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        """Start every node that is not running and wait until the cluster answers CQL.

        The seed starts first: the others need it to gossip with before they can join.
        """
        started = time.monotonic()
        layout = self.layout
        java = find_java()
        jars = ensure_jars(layout.version, self._home)
        layout.base_dir.mkdir(parents=True, exist_ok=True)
        (layout.base_dir / _STATE_FILE).write_text(layout.to_json())
        deadline = started + self.startup_timeout_s
        seed, others = 1, list(self._indexes())[1:]
        try:
            for batch in ([seed], others):
                for index in batch:
                    if self._alive_pid(index) is not None:
                        log.info("node %d (%s) is already running", index, layout.address(index))
                        continue
                    self._check_ports_free(index)
                    self._launch(index, java, jars)
                for index in batch:
                    self._wait_cql(index, deadline)
            self._wait_ring(deadline)
        except BaseException:
            # Leave nothing half-started behind: stop what this call launched.
            self._stop(list(self._children))
            raise
        log.info(
            "Cassandra %s: %d node(s) ready on %s port %d in %.1f s",
            layout.version,
            layout.nodes,
            ",".join(self.contact_points),
            self.port,
            since(started),
        )

    def stop(self) -> None:
        """Stop every node: SIGTERM, then SIGKILL after ``stop_timeout_s``. Idempotent."""
        self._stop(list(self._indexes()))

    def _stop(self, indexes: Sequence[int]) -> None:
        pids = {i: self._alive_pid(i) for i in indexes}
        for index, pid in pids.items():
            if pid is not None:
                log.info("stopping node %d (pid %d)", index, pid)
                send_signal(pid, signal.SIGTERM)
                # A node paused by a chaos test (SIGSTOP) acts on SIGTERM only once resumed.
                send_signal(pid, signal.SIGCONT)
        deadline = time.monotonic() + self.stop_timeout_s
        for index, pid in pids.items():
            if pid is None:
                continue
            if not self._wait_exit(index, pid, deadline):
                log.warning("node %d (pid %d) ignored SIGTERM; killing it", index, pid)
                send_signal(pid, signal.SIGKILL)
                self._wait_exit(index, pid, time.monotonic() + 10)
            with contextlib.suppress(FileNotFoundError):
                (self.layout.node_dir(index) / _PID_FILE).unlink()
            self._children.pop(index, None)

    def kill_node(self, index: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send one node a signal (chaos tests: SIGKILL, SIGSTOP, SIGCONT)."""
        pid = self._alive_pid(index)
        if pid is None:
            raise CassandraError(f"node {index} is not running")
        send_signal(pid, sig)

    def start_node(self, index: int) -> None:
        """Restart one stopped node on its existing data and wait for CQL."""
        if self._alive_pid(index) is None:
            self._launch(index, find_java(), ensure_jars(self.layout.version, self._home))
        self._wait_cql(index, time.monotonic() + self.startup_timeout_s)

    def status(self) -> list[NodeStatus]:
        out = []
        for index in self._indexes():
            pid = _read_pid(self.layout.node_dir(index))
            alive = self._alive_pid(index) is not None
            out.append(
                NodeStatus(
                    index=index,
                    address=self.layout.address(index),
                    pid=pid,
                    process_alive=alive,
                    cql_ready=alive and _cql_answers(self.layout.address(index), self.port),
                    directory=self.layout.node_dir(index),
                )
            )
        return out

    def __enter__(self) -> CassandraCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- one node ---------------------------------------------------------------

    def _launch(self, index: int, java: str, jars: Path) -> None:
        node_dir = self.layout.node_dir(index)
        for sub in ("data", "commitlog", "hints", "saved_caches", "cdc_raw", "triggers", "logs"):
            (node_dir / sub).mkdir(parents=True, exist_ok=True)
        (node_dir / "cassandra.yaml").write_text(render_yaml(node_config(self.layout, index)))
        (node_dir / "logback.xml").write_text(_LOGBACK_XML.format(log_dir=node_dir / "logs"))
        command = java_command(self.layout, index, java, jars)
        (node_dir / "command.txt").write_text(" ".join(command) + "\n")
        pid = spawn(command, node_dir / "logs" / "stdout.log")
        self._children[index] = pid
        (node_dir / _PID_FILE).write_text(f"{pid}\n")
        log.info(
            "started node %d on %s (pid %d, dir %s)",
            index,
            self.layout.address(index),
            pid,
            node_dir,
        )

    def _alive_pid(self, index: int) -> int | None:
        """The node's pid if that process is alive and really is this node's Cassandra."""
        child = self._children.get(index)
        if child is not None:
            return child if child_running(child) else None
        node_dir = self.layout.node_dir(index)
        pid = _read_pid(node_dir)
        if pid is None or not _is_our_node(pid, node_dir):
            return None
        return pid

    def _wait_exit(self, index: int, pid: int, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self._alive_pid(index) != pid:
                return True
            time.sleep(0.1)
        return False

    def _wait_cql(self, index: int, deadline: float) -> None:
        address = self.layout.address(index)
        while True:
            if self._alive_pid(index) is None:
                logtail = self._logtail(index)
                error = (
                    CassandraPortTaken
                    if any(failure in logtail for failure in _BIND_FAILURES)
                    else CassandraError
                )
                raise error(
                    f"node {index} ({address}) exited during startup; last log lines:\n" + logtail
                )
            if _port_open(address, self.port) and _cql_answers(address, self.port):
                log.info("node %d (%s) answers CQL", index, address)
                return
            if time.monotonic() > deadline:
                raise CassandraError(
                    f"node {index} ({address}) did not answer CQL on port {self.port} within "
                    f"{self.startup_timeout_s:.0f} s; last log lines:\n" + self._logtail(index)
                )
            time.sleep(0.5)

    def _wait_ring(self, deadline: float) -> None:
        """Wait until every node sees every other one as a peer with a schema version.

        Until then a keyspace created through one node may count fewer replicas than
        asked for, and schema changes may not reach everyone.
        """
        if self.layout.nodes == 1:
            return
        addresses = [self.layout.address(i) for i in self._indexes()]
        waiting = set(addresses)
        while True:
            for address in sorted(waiting):
                others = set(addresses) - {address}
                if others <= _cql_peers(address, self.port):
                    waiting.discard(address)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise CassandraError(
                    f"nodes {sorted(waiting)} did not see the whole ring within "
                    f"{self.startup_timeout_s:.0f} s"
                )
            time.sleep(0.5)

    def _check_ports_free(self, index: int) -> None:
        address = self.layout.address(index)
        for name, port in (
            ("native_transport_port", self.layout.native_transport_port),
            ("storage_port", self.layout.storage_port),
        ):
            if _port_open(address, port):
                raise CassandraError(
                    f"{address}:{port} ({name}) is already in use; stop what listens there "
                    f"or choose another {name}"
                )
        jmx = self.layout.jmx_port + index - 1
        if _port_open("127.0.0.1", jmx):
            raise CassandraError(f"JMX port 127.0.0.1:{jmx} is already in use; choose jmx_port")

    def _logtail(self, index: int) -> str:
        logs = self.layout.node_dir(index) / "logs"
        parts = []
        for name in ("stdout.log", "system.log"):
            path = logs / name
            if path.is_file():
                parts.append(f"--- {path}\n{tail(path.read_text(errors='replace'), 25)}")
        return "\n".join(parts)


def start_on_free_ports(
    nodes: int,
    base_dir: str | os.PathLike[str],
    *,
    attempts: int = 3,
    **options: Any,
) -> CassandraCluster:
    """Start a new cluster in ``base_dir`` on ports :func:`free_ports` claims for it.

    A port can still be taken by a process that does not claim ports before the node
    binds it (~15 s after it was chosen); the node then exits and this starts it again
    in a fresh ``base_dir`` on other ports, up to ``attempts`` times in all. ``options``
    are :class:`CassandraCluster`'s other keyword arguments.
    """
    attempt = 1
    while True:
        cluster = CassandraCluster(nodes, base_dir, **options)
        # Every node listens on the CQL and storage ports; node i on JMX port jmx + i - 1.
        native, storage = free_ports(2, hosts=cluster.contact_points)
        (jmx,) = free_ports(1, span=nodes)
        cluster.layout = dataclasses.replace(
            cluster.layout, native_transport_port=native, storage_port=storage, jmx_port=jmx
        )
        try:
            cluster.start()
        except CassandraPortTaken:
            if attempt == attempts:
                raise
            log.warning("a port was taken while Cassandra started (attempt %d); again", attempt)
            # start() stopped what it launched; its data is for nobody.
            shutil.rmtree(cluster.layout.base_dir)
            attempt += 1
            continue
        return cluster


def node_config(layout: ClusterLayout, index: int) -> dict[str, Any]:
    """The ``cassandra.yaml`` settings of one node (the loader rejects unknown keys)."""
    node_dir = layout.node_dir(index)
    address = layout.address(index)
    token = _MIN_TOKEN + (index - 1) * (_RING_SIZE // layout.nodes)
    config: dict[str, Any] = {
        "cluster_name": layout.cluster_name,
        "num_tokens": 1,
        "initial_token": str(token),
        "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
        "endpoint_snitch": "SimpleSnitch",
        "commitlog_sync": "periodic",
        "commitlog_sync_period": "10000ms",
        "seed_provider": [
            {
                "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                "parameters": [{"seeds": f"{layout.address(1)}:{layout.storage_port}"}],
            }
        ],
        "listen_address": address,
        "rpc_address": address,
        "storage_port": layout.storage_port,
        "native_transport_port": layout.native_transport_port,
        "start_native_transport": True,
        "data_file_directories": [str(node_dir / "data")],
        "commitlog_directory": str(node_dir / "commitlog"),
        "hints_directory": str(node_dir / "hints"),
        "saved_caches_directory": str(node_dir / "saved_caches"),
        "cdc_raw_directory": str(node_dir / "cdc_raw"),
        # Two round trips per LWT instead of four: the commit point is an LWT (rule S1).
        "paxos_variant": "v2",
        "auto_snapshot": False,
        # A fresh ring: nobody to stream from, so joining nodes must not try.
        "auto_bootstrap": False,
        # Every node is 5.0 from its first start: no 4.x sstable format to stay compatible with.
        "storage_compatibility_mode": "NONE",
        "concurrent_compactors": 1,
    }
    config.update(layout.extra_yaml)
    return config


def render_yaml(config: Mapping[str, Any]) -> str:
    """One ``key: value`` line per setting; JSON values are valid YAML flow values."""
    lines = ["# Generated by percolake.tools.cassandra.launcher; edits are overwritten on start."]
    lines += [f"{key}: {json.dumps(value)}" for key, value in config.items()]
    return "\n".join(lines) + "\n"


def java_command(layout: ClusterLayout, index: int, java: str, jars: Path) -> list[str]:
    """The command line of one node (what ``bin/cassandra`` would run, minus the shell)."""
    node_dir = layout.node_dir(index)
    jamm = sorted(jars.glob("jamm-*.jar"))
    if not jamm:
        raise CassandraError(f"no jamm jar in {jars}: the Cassandra fetch is incomplete")
    classpath = os.pathsep.join(str(p) for p in sorted(jars.glob("*.jar")))
    properties = {
        "cassandra.config": (node_dir / "cassandra.yaml").as_uri(),
        "logback.configurationFile": str(node_dir / "logback.xml"),
        "cassandra.logdir": str(node_dir / "logs"),
        "cassandra.storagedir": str(node_dir),
        "cassandra.triggers_dir": str(node_dir / "triggers"),
        "cassandra-foreground": "yes",
        "cassandra.jmx.local.port": str(layout.jmx_port + index - 1),
        "java.net.preferIPv4Stack": "true",
        "jdk.attach.allowAttachSelf": "true",
        "io.netty.tryReflectionSetAccessible": "true",
        "io.netty.allocator.useCacheForAllThreads": "true",
        "io.netty.allocator.maxOrder": "11",
        **_FAST_START_PROPERTIES,
    }
    return [
        java,
        f"-Xms{layout.heap_mb}M",
        f"-Xmx{layout.heap_mb}M",
        *_JVM_GC_FLAGS,
        f"-XX:ErrorFile={node_dir / 'logs' / 'hs_err_%p.log'}",
        f"-XX:HeapDumpPath={node_dir / 'logs'}",
        *_JVM17_MODULE_FLAGS,
        f"-javaagent:{jamm[-1]}",
        *(f"-D{k}={v}" for k, v in properties.items()),
        "-cp",
        classpath,
        "org.apache.cassandra.service.CassandraDaemon",
    ]


# --- process and network helpers ------------------------------------------------------


def _read_pid(node_dir: Path) -> int | None:
    try:
        return int((node_dir / _PID_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _is_our_node(pid: int, node_dir: Path) -> bool:
    """Whether ``pid`` is alive and is the Cassandra of ``node_dir`` (pids get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = stat_fields(Path(f"/proc/{pid}/stat"))[0]
    except OSError:
        return False
    if state == "Z":  # a zombie has exited already
        return False
    yaml_uri = (node_dir / "cassandra.yaml").as_uri().encode()
    return b"CassandraDaemon" in cmdline and yaml_uri in cmdline


def _port_open(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((address, port)) == 0


def _cql_session_query(address: str, port: int, query: str) -> list[Any] | None:
    """Run one query on one node; ``None`` when it does not answer."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import WhiteListRoundRobinPolicy

    profile = ExecutionProfile(
        load_balancing_policy=WhiteListRoundRobinPolicy([address]), request_timeout=5.0
    )
    cluster = Cluster(
        [address],
        port=port,
        protocol_version=5,
        connect_timeout=3,
        control_connection_timeout=3,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
    )
    try:
        session = cluster.connect()
        return list(session.execute(query))
    except Exception as exc:  # any failure means "not ready yet"
        log.debug("CQL on %s:%d not ready: %s", address, port, exc)
        return None
    finally:
        cluster.shutdown()


def _cql_answers(address: str, port: int) -> bool:
    rows = _cql_session_query(address, port, "SELECT release_version FROM system.local")
    return bool(rows)


def _cql_peers(address: str, port: int) -> set[str]:
    rows = _cql_session_query(address, port, "SELECT peer, schema_version FROM system.peers_v2")
    return {str(r.peer) for r in rows or () if r.schema_version is not None}


# --- command line -------------------------------------------------------------------


def add_cassandra_commands(
    subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
) -> argparse.ArgumentParser:
    """Add ``cassandra start|stop|status|fetch``; dispatch with ``run_cassandra_command``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "cassandra", help="run a local Apache Cassandra (jars from Maven Central)"
    )
    _add_actions(parser)
    parser.set_defaults(handler=run_cassandra_command)
    return parser


def _add_actions(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="cassandra_command", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="start nodes on 127.0.0.1.. and wait for CQL")
    start.add_argument("--nodes", type=int, default=1, help="number of nodes (default 1)")
    start.add_argument("--port", type=int, default=9042, help="CQL port (default 9042)")
    start.add_argument("--storage-port", type=int, default=7000, help="gossip port (7000)")
    start.add_argument("--jmx-port", type=int, default=7199, help="JMX port of node 1 (7199)")
    start.add_argument("--heap-mb", type=int, default=1024, help="heap per node (1024)")
    start.add_argument("--version", default=DEFAULT_VERSION, help="Cassandra version")
    stop = actions.add_parser("stop", help="stop the nodes of a cluster directory")
    status = actions.add_parser("status", help="show the nodes of a cluster directory")
    for action in (start, stop, status):
        action.add_argument(
            "--dir",
            default=str(DEFAULT_CLUSTER_DIR),
            help=f"cluster directory (default {DEFAULT_CLUSTER_DIR})",
        )
    fetch = actions.add_parser("fetch", help="fetch the jars into the cache and exit")
    fetch.add_argument("--version", default=DEFAULT_VERSION, help="Cassandra version")


def run_cassandra_command(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Carry out a parsed ``cassandra`` command; returns the exit code."""
    out = out or sys.stdout
    try:
        if args.cassandra_command == "fetch":
            out.write(f"{ensure_jars(args.version)}\n")
            return 0
        if args.cassandra_command == "start":
            cluster = CassandraCluster(
                args.nodes,
                args.dir,
                version=args.version,
                native_transport_port=args.port,
                storage_port=args.storage_port,
                jmx_port=args.jmx_port,
                heap_mb=args.heap_mb,
            )
            cluster.start()
            out.write(f"contact points: {','.join(cluster.contact_points)} port {cluster.port}\n")
            out.write(f"store url: {cluster.store_url('percolake')}\n")
            return 0
        cluster = CassandraCluster.from_dir(args.dir)
        if args.cassandra_command == "stop":
            cluster.stop()
            return 0
        statuses = cluster.status()
        for s in statuses:
            state = "up" if s.cql_ready else ("starting" if s.process_alive else "down")
            out.write(f"node{s.index} {s.address}:{cluster.port} pid={s.pid} {state}\n")
        return 0 if all(s.cql_ready for s in statuses) else 1
    except CassandraError as exc:
        log.error("%s", exc)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``percolake cassandra``'s arguments, e.g. ``main(["start", "--nodes", "3"])``.

    Also ``python -m percolake.tools.cassandra start|stop|status|fetch ...``.
    """
    parser = argparse.ArgumentParser(
        prog="percolake cassandra", description="Run a local Apache Cassandra."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    _add_actions(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return run_cassandra_command(args)
