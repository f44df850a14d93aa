"""Run a real S3 server (MinIO, built from the Go module proxy) on this machine's loopback.

``ensure_minio`` builds ``github.com/minio/minio`` with ``go install`` once, into a cache
shared by every clone on the machine (``~/.cache/percolake/minio``, or
``$PERCOLAKE_MINIO_HOME``), the way the Cassandra launcher caches its jars. No Docker
and no downloaded release binary: the module proxy and its checksum database are what
pins the code. :class:`S3Server` starts ``minio server`` on 127.0.0.1 with a data folder,
a generated root secret and a readiness check, and keeps its pid, ports and credentials
in a state file (mode 0600) in its directory, so ``percolake s3 stop --dir DIR`` works
from any process and a restart on the same folder finds its objects again.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import ipaddress
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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

#: The Go module MinIO is built from.
MINIO_MODULE = "github.com/minio/minio"

#: The MinIO commit built when none is asked for (a pseudo-version of the module proxy).
DEFAULT_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"

#: Where the binary is cached unless ``$PERCOLAKE_MINIO_HOME`` says otherwise.
DEFAULT_HOME = Path("~/.cache/percolake/minio")

#: Where ``percolake s3 start`` keeps its data unless ``--dir`` says otherwise.
DEFAULT_SERVER_DIR = Path("~/.local/share/percolake/s3")

#: The root user of every server this launcher starts; the secret is generated.
ROOT_USER = "percolake"

#: MinIO's default region; clients must sign requests for it.
REGION = "us-east-1"

_STATE_FILE = "s3.json"
_LOG_FILE = "minio.log"
_DATA_DIR = "data"
_COMPLETE_MARKER = ".complete"
_BUILD_LOG = "build.log"

# A cold build takes ~10 min on 2 cores; a build still running after an hour is stuck
# (a hung proxy connection, say), and the caller deserves an error instead of a hang.
_BUILD_TIMEOUT_S = 3600.0
_BUILD_PROGRESS_EVERY_S = 60.0
# Free ports picked here may be taken before MinIO binds them; three picks in a row
# losing that race means something else is wrong.
_PORT_ATTEMPTS = 3
# A health probe on loopback answers in milliseconds; a slower one is a paused server.
_PROBE_TIMEOUT_S = 1.0

# S3's bucket naming rules (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules).
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


class S3Error(PercolakeError, RuntimeError):
    """MinIO could not be built, started or stopped; the message says why."""


# --- the binary ---------------------------------------------------------------------


def minio_home() -> Path:
    """The binary cache: ``$PERCOLAKE_MINIO_HOME`` or ``~/.cache/percolake/minio``."""
    configured = os.environ.get("PERCOLAKE_MINIO_HOME")
    return Path(configured).expanduser() if configured else DEFAULT_HOME.expanduser()


def minio_binary(version: str = DEFAULT_VERSION, home: Path | None = None) -> Path:
    """Where the binary of one MinIO version lives inside the cache."""
    return (home or minio_home()) / version / "bin" / "minio"


def minio_present(version: str = DEFAULT_VERSION, home: Path | None = None) -> bool:
    """Whether a finished build of ``version`` is cached (its marker is written last)."""
    binary = minio_binary(version, home)
    return (binary.parent.parent / _COMPLETE_MARKER).is_file() and binary.is_file()


def ensure_minio(
    version: str = DEFAULT_VERSION, home: Path | None = None, *, go: str = "go"
) -> Path:
    """Return the path of the MinIO binary of ``version``, building it first if needed.

    Safe to call from several processes at once (pytest-xdist workers, two clones): a
    file lock serialises builds, and a marker written after the binary is in place means
    a half-finished build is never mistaken for a cache.
    """
    home = home or minio_home()
    binary = minio_binary(version, home)
    if minio_present(version, home):
        return binary
    version_dir = binary.parent.parent
    version_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(home / "build.lock"):
        if minio_present(version, home):  # another process built it while we waited
            return binary
        go_path = shutil.which(go)
        command = [go, "install", f"{MINIO_MODULE}@{version}"]
        if go_path is None:
            raise S3Error(
                f"cannot build MinIO {version}: no Go toolchain ({go!r} is not on PATH); "
                f"install Go from https://go.dev/dl, then run: go install {MINIO_MODULE}@{version}"
            )
        staging = version_dir / "bin.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        build_log = version_dir / _BUILD_LOG
        log.info(
            "building MinIO %s from the Go module proxy into %s "
            "(~10 min on 2 cores the first time; output in %s)",
            version,
            binary,
            build_log,
        )
        started = time.monotonic()
        returncode = _run_build(
            [go_path, *command[1:]],
            {**os.environ, "GOBIN": str(staging), "GOFLAGS": "-mod=mod"},
            build_log,
        )
        output = build_log.read_text(errors="replace")
        if returncode != 0:
            raise S3Error(
                f"go install failed (exit {returncode}) building MinIO {version}:\n"
                f"$ GOBIN={staging} GOFLAGS=-mod=mod {' '.join(command)}\n{tail(output, 40)}"
            )
        if not (staging / "minio").is_file():
            raise S3Error(f"go install finished but left no minio binary in {staging}")
        shutil.rmtree(binary.parent, ignore_errors=True)
        staging.rename(binary.parent)
        (version_dir / _COMPLETE_MARKER).write_text(f"{MINIO_MODULE}@{version}\n")
        log.info("built MinIO %s in %.0f s: %s", version, since(started), binary)
    return binary


def _run_build(command: Sequence[str], env: dict[str, str], output: Path) -> int:
    """Run the build with its output in ``output``, logging progress while it lasts."""
    started = time.monotonic()
    with output.open("w") as sink:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            while True:
                try:
                    return process.wait(timeout=_BUILD_PROGRESS_EVERY_S)
                except subprocess.TimeoutExpired:
                    if since(started) > _BUILD_TIMEOUT_S:
                        raise S3Error(
                            f"building MinIO took over {_BUILD_TIMEOUT_S:.0f} s; gave up "
                            f"(output so far in {output})"
                        ) from None
                    log.info("still building MinIO (%.0f min so far)", since(started) / 60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


# --- buckets ------------------------------------------------------------------------


def validate_bucket_name(name: str) -> None:
    """Raise ``ValueError`` naming the broken rule unless ``name`` is a valid S3 bucket.

    Checked here because MinIO and AWS answer a bad name with a bare
    ``InvalidBucketName`` that does not say which rule it broke.
    """
    if not 3 <= len(name) <= 63:
        raise ValueError(f"bucket name {name!r} must be 3 to 63 characters long")
    if not _BUCKET_NAME.fullmatch(name):
        raise ValueError(
            f"bucket name {name!r} may hold only lowercase letters, digits, '.' and '-', "
            "and must begin and end with a letter or digit"
        )
    if ".." in name or ".-" in name or "-." in name:
        raise ValueError(f"bucket name {name!r} must not have '..', '.-' or '-.'")
    if _looks_like_ipv4(name):
        raise ValueError(f"bucket name {name!r} must not look like an IP address")
    if name.startswith(_RESERVED_BUCKET_PREFIXES) or name.endswith(_RESERVED_BUCKET_SUFFIXES):
        raise ValueError(f"bucket name {name!r} uses a prefix or suffix S3 reserves")


def _looks_like_ipv4(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


# --- the server ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class S3Status:
    """What ``S3Server.status`` found."""

    pid: int | None
    endpoint_url: str
    process_alive: bool
    ready: bool
    base_dir: Path


@dataclass(frozen=True, slots=True)
class _State:
    """Everything another process needs to find the server again; saved as ``s3.json``."""

    pid: int | None
    #: The kernel's start time of ``pid`` (clock ticks after boot): with the pid, it names
    #: one process for good, where a pid alone is reused once that process is gone.
    pid_started: int | None
    port: int
    console_port: int
    access_key: str
    secret_key: str
    version: str


class S3Server:
    """One MinIO server on 127.0.0.1, its objects under ``base_dir/data``.

    ``S3Server(d).start()`` returns once MinIO answers its readiness probe; ``env()``
    gives the AWS variables a client needs. Use it as a context manager to stop it on
    exit. ``pause``, ``resume`` and ``kill`` are the faults chaos tests inject; after a
    ``kill``, ``start`` again serves the same objects.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        console_port: int | None = None,
        version: str = DEFAULT_VERSION,
        home: Path | None = None,
        startup_timeout_s: float = 60.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        for name, value in (("port", port), ("console_port", console_port)):
            if value is not None and not 1 <= value <= 65535:
                raise ValueError(f"{name} must be between 1 and 65535, got {value}")
        if port is not None and port == console_port:
            raise ValueError(f"port and console_port must differ, both are {port}")
        self.base_dir = Path(base_dir).expanduser().absolute()
        self.version = version
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._home = home
        self._child: int | None = None  # the pid of a server this object spawned
        saved = self._load_state()
        # A restart keeps the endpoint and the root secret clients were given (MinIO
        # also refuses to read its own config back under another root secret).
        self._port = port if port is not None else (saved.port if saved else None)
        self._console_port = (
            console_port if console_port is not None else (saved.console_port if saved else None)
        )
        self._secret_key = saved.secret_key if saved else None

    @classmethod
    def from_dir(cls, base_dir: str | os.PathLike[str]) -> S3Server:
        """The server a previous ``start`` left in ``base_dir`` (reads its state file)."""
        state = Path(base_dir).expanduser().absolute() / _STATE_FILE
        if not state.is_file():
            raise S3Error(f"no S3 server in {state.parent} (missing {_STATE_FILE})")
        saved = _read_state(state)
        return cls(state.parent, version=saved.version)

    # --- what clients need -------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise S3Error(f"the S3 server in {self.base_dir} has no port yet: start() it first")
        return self._port

    @property
    def console_port(self) -> int:
        if self._console_port is None:
            raise S3Error(f"the S3 server in {self.base_dir} has no port yet: start() it first")
        return self._console_port

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_key(self) -> str:
        return ROOT_USER

    @property
    def secret_key(self) -> str:
        if self._secret_key is None:
            raise S3Error(f"the S3 server in {self.base_dir} has no secret yet: start() it first")
        return self._secret_key

    @property
    def data_dir(self) -> Path:
        return self.base_dir / _DATA_DIR

    @property
    def log_path(self) -> Path:
        return self.base_dir / _LOG_FILE

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client (SDK, pyarrow, Hadoop s3a) here.

        ``AWS_DEFAULT_REGION`` too, for SDKs (botocore) that read only that name, and
        ``AWS_EC2_METADATA_DISABLED`` so none of them probes 169.254.169.254 for
        credentials, a connect timeout on every machine outside EC2.
        """
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (nothing happens if it exists) and return its name."""
        validate_bucket_name(name)
        from pyarrow import fs

        filesystem = fs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=self.endpoint_url,
            scheme="http",
            region=REGION,
            allow_bucket_creation=True,
            connect_timeout=5,
            request_timeout=30,
        )
        try:
            filesystem.create_dir(name)
        except OSError as exc:
            raise S3Error(f"cannot create bucket {name!r} on {self.endpoint_url}: {exc}") from exc
        return name

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start MinIO unless it runs, and wait until it answers its readiness probe."""
        started = time.monotonic()
        deadline = started + self.startup_timeout_s
        if self.alive():
            log.info("MinIO in %s is already running (pid %s)", self.base_dir, self._alive_pid())
            self._wait_ready(deadline, log_offset=0)
            return
        binary = ensure_minio(self.version, self._home)
        self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data_dir.mkdir(exist_ok=True)
        if self._secret_key is None:
            self._secret_key = secrets.token_urlsafe(30)
        port_given, console_given = self._port is not None, self._console_port is not None
        self._check_ports_free()  # the given ones: fail at once, no pick can help
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._choose_ports()
            try:
                self._launch(binary, deadline)
                break
            except S3Error as exc:
                # A free port we picked can be taken before MinIO binds it (another
                # xdist worker picking ports at the same moment): pick again.
                picked_here = not (port_given and console_given)
                if not (picked_here and "already in use" in str(exc)) or (
                    attempt == _PORT_ATTEMPTS
                ):
                    raise
                log.info("port taken before MinIO bound it (attempt %d); picking again", attempt)
                self._port = self._port if port_given else None
                self._console_port = self._console_port if console_given else None
        log.info(
            "MinIO ready on %s in %.1f s (pid %d, data %s)",
            self.endpoint_url,
            since(started),
            self._child,
            self.data_dir,
        )

    def _choose_ports(self) -> None:
        # free_ports never hands out a port again while its claim lasts, so the two
        # cannot meet, nor meet a given one (which is in use or checked below).
        if self._port is None:
            (self._port,) = free_ports(1)
        if self._console_port is None:
            (self._console_port,) = free_ports(1)
        self._check_ports_free()

    def _check_ports_free(self) -> None:
        for name, port in (("port", self._port), ("console port", self._console_port)):
            if port is not None and not _port_free(port):
                raise S3Error(
                    f"127.0.0.1:{port} (the S3 {name}) is already in use; stop what listens "
                    "there or choose another port (--port, --console-port)"
                )

    def _launch(self, binary: Path, deadline: float) -> None:
        """Spawn MinIO and wait for it; on any failure, stop it before raising."""
        command = [
            str(binary),
            "server",
            str(self.data_dir),
            "--address",
            f"127.0.0.1:{self.port}",
            "--console-address",
            f"127.0.0.1:{self.console_port}",
        ]
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            # No call home to dl.min.io: tests and air-gapped machines have no business there.
            "MINIO_UPDATE": "off",
        }
        with self.log_path.open("a") as sink:
            sink.write(f"--- percolake: {' '.join(command)}\n")
            log_offset = sink.tell()
        self._child = spawn(command, self.log_path, env, mode=0o600)
        self._save_state(self._child)
        try:
            self._wait_ready(deadline, log_offset)
        except BaseException:
            # Leave nothing half-started behind: stop what this call launched.
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``stop_timeout_s``. Idempotent."""
        pid = self._alive_pid()
        if pid is not None:
            log.info("stopping MinIO (pid %d)", pid)
            send_signal(pid, signal.SIGTERM)
            # A server paused by a chaos test (SIGSTOP) acts on SIGTERM only once resumed.
            send_signal(pid, signal.SIGCONT)
            if not self._wait_exit(pid, time.monotonic() + self.stop_timeout_s):
                log.warning("MinIO (pid %d) ignored SIGTERM; killing it", pid)
                send_signal(pid, signal.SIGKILL)
                self._wait_exit(pid, time.monotonic() + 10)
        self._child = None
        if self._load_state() is not None:
            self._save_state(None)

    def kill(self) -> None:
        """SIGKILL the server and wait until it is gone (a crash, for chaos tests)."""
        pid = self._running_pid("kill")
        send_signal(pid, signal.SIGKILL)
        if not self._wait_exit(pid, time.monotonic() + 10):
            raise S3Error(f"MinIO (pid {pid}) still runs 10 s after SIGKILL")
        self._child = None  # reaped: its pid may now belong to anyone

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open and requests hang, as on a stalled host."""
        send_signal(self._running_pid("pause"), signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        send_signal(self._running_pid("resume"), signal.SIGCONT)

    def alive(self) -> bool:
        """Whether the server's process runs (paused counts: it is there, just stopped)."""
        return self._alive_pid() is not None

    def ready(self) -> bool:
        """Whether the process runs and its health probe (``_health_ready``) answers 200."""
        return self.alive() and _health_ready(self.endpoint_url)

    def status(self) -> S3Status:
        state = self._load_state()
        alive = self.alive()
        return S3Status(
            pid=state.pid if state else None,
            endpoint_url=self.endpoint_url,
            process_alive=alive,
            ready=alive and _health_ready(self.endpoint_url),
            base_dir=self.base_dir,
        )

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals -------------------------------------------------------------

    def _running_pid(self, action: str) -> int:
        pid = self._alive_pid()
        if pid is None:
            raise S3Error(f"cannot {action} MinIO in {self.base_dir}: it is not running")
        return pid

    def _alive_pid(self) -> int | None:
        """The server's pid if that process is alive and really is this folder's MinIO."""
        if self._child is not None:
            return self._child if child_running(self._child) else None
        state = self._load_state()
        if state is None or state.pid is None:
            return None
        if _process_started(state.pid) != state.pid_started:
            return None  # gone, a zombie, or the pid belongs to another process now
        return state.pid

    def _wait_exit(self, pid: int, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self._alive_pid() != pid:
                return True
            time.sleep(0.05)
        return False

    def _wait_ready(self, deadline: float, log_offset: int) -> None:
        while True:
            # Probe first, then check the process: a 200 from whatever else listens on
            # the port (MinIO exits when it cannot bind it) must not count as ready.
            ready = _health_ready(self.endpoint_url)
            if not self.alive():
                raise S3Error(
                    f"MinIO exited during startup ({self.endpoint_url}, data {self.data_dir}); "
                    f"last lines of {self.log_path}:\n{self._logtail(log_offset)}"
                )
            if ready:
                return
            if time.monotonic() > deadline:
                raise S3Error(
                    f"MinIO did not become ready on {self.endpoint_url} within "
                    f"{self.startup_timeout_s:.0f} s; last lines of {self.log_path}:\n"
                    + self._logtail(log_offset)
                )
            time.sleep(0.1)

    def _logtail(self, offset: int) -> str:
        """The last lines MinIO wrote after ``offset`` (this launch's, not older runs')."""
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(offset)
                return tail(handle.read().decode(errors="replace"), 25)
        except FileNotFoundError:
            return "(no log)"

    def _load_state(self) -> _State | None:
        path = self.base_dir / _STATE_FILE
        return _read_state(path) if path.is_file() else None

    def _save_state(self, pid: int | None) -> None:
        """Write the state file atomically, readable by its owner only: it holds the secret."""
        state = _State(
            pid=pid,
            pid_started=None if pid is None else _process_started(pid),
            port=self.port,
            console_port=self.console_port,
            access_key=self.access_key,
            secret_key=self.secret_key,
            version=self.version,
        )
        path = self.base_dir / _STATE_FILE
        partial = path.with_name(_STATE_FILE + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o600)  # an older partial file may have other bits
            handle.write(json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True))
        os.replace(partial, path)


def _read_state(path: Path) -> _State:
    try:
        return _State(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise S3Error(f"{path} is not a percolake S3 state file: {exc}") from exc


# --- process and network helpers ------------------------------------------------------


def _process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None once it has exited.

    It counts as running until every thread of it is a zombie: a Go server's main thread
    may show ``Z`` while its other threads still exit, holding the listening socket.
    """
    task_dir = Path(f"/proc/{pid}/task")
    try:
        leader = stat_fields(Path(f"/proc/{pid}/stat"))
        tasks = list(task_dir.iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            if stat_fields(task / "stat")[0] not in ("Z", "X"):
                # fields[19] is the start time (field 22 of proc_pid_stat(5)).
                return int(leader[19])
        except OSError:
            continue  # that thread is gone
    return None


def _port_free(port: int) -> bool:
    """Whether MinIO can listen on 127.0.0.1:``port``.

    A bind with ``SO_REUSEADDR``, as MinIO's own: a port left in TIME_WAIT by a killed
    server is free to it, one with a listener is not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


# The probe goes straight to loopback: an HTTP(S)_PROXY in the environment must not
# carry it to a proxy that cannot reach 127.0.0.1.
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _health_ready(endpoint_url: str) -> bool:
    """Whether MinIO serves requests: ``/minio/health/cluster`` answers 200 only once the
    object layer, the bucket metadata and IAM are up. ``/minio/health/ready`` answered
    200 before that (it only sets a header while the object layer is missing), and a
    ListBuckets right after it got "503 Server not initialized yet" (ci14)."""
    url = f"{endpoint_url}/minio/health/cluster"
    try:
        with _direct.open(url, timeout=_PROBE_TIMEOUT_S) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# --- command line -------------------------------------------------------------------


def add_s3_commands(
    subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
) -> argparse.ArgumentParser:
    """Add ``s3 start|stop|status|fetch``; dispatch with ``run_s3_command``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "s3", help="run a local S3 server (MinIO, built from the Go module proxy)"
    )
    _add_actions(parser)
    parser.set_defaults(handler=run_s3_command)
    return parser


def _port_argument(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 1 and 65535, got {port}")
    return port


def _bucket_argument(text: str) -> str:
    try:
        validate_bucket_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_actions(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="s3_command", required=True, metavar="ACTION")
    start = actions.add_parser(
        "start", help="start MinIO on 127.0.0.1 and print the AWS variables to export"
    )
    start.add_argument(
        "--port", type=_port_argument, help="S3 API port (default: the last one, else a free one)"
    )
    start.add_argument(
        "--console-port", type=_port_argument, help="web console port (default as for --port)"
    )
    start.add_argument(
        "--bucket",
        action="append",
        type=_bucket_argument,
        default=[],
        help="create this bucket once the server is up (repeatable; needs pyarrow)",
    )
    start.add_argument("--version", default=DEFAULT_VERSION, help="MinIO module version")
    stop = actions.add_parser("stop", help="stop the server of a directory")
    status = actions.add_parser("status", help="show the server of a directory (exit 1 if down)")
    for action in (start, stop, status):
        action.add_argument(
            "--dir",
            default=str(DEFAULT_SERVER_DIR),
            help=f"server directory: data, log, state (default {DEFAULT_SERVER_DIR})",
        )
    fetch = actions.add_parser("fetch", help="build MinIO into the cache and print its path")
    fetch.add_argument("--version", default=DEFAULT_VERSION, help="MinIO module version")


def export_lines(server: S3Server) -> list[str]:
    """``export NAME=value`` lines for a shell, values quoted."""
    return [f"export {name}={shlex.quote(value)}" for name, value in server.env().items()]


def run_s3_command(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Carry out a parsed ``s3`` command; returns the exit code."""
    out = out or sys.stdout
    try:
        if args.s3_command == "fetch":
            out.write(f"{ensure_minio(args.version)}\n")
            return 0
        if args.s3_command == "start":
            server = S3Server(
                args.dir, port=args.port, console_port=args.console_port, version=args.version
            )
            server.start()
            for bucket in args.bucket:
                server.create_bucket(bucket)
            out.write(
                f"# MinIO on {server.endpoint_url} (pid {server.status().pid}, console "
                f"http://127.0.0.1:{server.console_port}, data {server.data_dir}, "
                f"log {server.log_path}); stop: percolake s3 stop --dir {server.base_dir}\n"
            )
            out.write("".join(f"{line}\n" for line in export_lines(server)))
            return 0
        server = S3Server.from_dir(args.dir)
        if args.s3_command == "stop":
            server.stop()
            return 0
        status = server.status()
        state = "up" if status.ready else ("starting" if status.process_alive else "down")
        out.write(f"pid={status.pid or '-'} {status.endpoint_url} {state}\n")
        return 0 if status.ready else 1
    except S3Error as exc:
        log.error("%s", exc)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``percolake s3``'s arguments, e.g. ``main(["start", "--dir", "/tmp/s3"])``.

    Also ``python -m percolake.tools.s3 start|stop|status|fetch ...``.
    """
    parser = argparse.ArgumentParser(
        prog="percolake s3", description="Run a local S3 server (MinIO)."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    _add_actions(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return run_s3_command(args)
