"""The S3 launcher against a real MinIO: start, status, stop, faults, the CLI, the cache.

Every server here is MinIO built from the Go module proxy (``percolake.tools.s3``);
each test that starts its own stops it, and the ones about failures check that no
process is left behind. The session fixtures of ``tests/s3_plugin.py`` are checked
at the end.
"""

from __future__ import annotations

import os
import shlex
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyarrow import fs

from percolake import cli
from percolake.tools.s3 import (
    DEFAULT_VERSION,
    REGION,
    S3Error,
    S3Server,
    ensure_minio,
    minio_binary,
    minio_present,
    validate_bucket_name,
)

pytestmark = pytest.mark.integration

# A CLI call starts Python, maybe pyarrow, and a server that is ready in 1-2 s.
COMMAND_TIMEOUT_S = 120.0
# How long a request to a paused server may take before the client gives up; short, so
# the test proves a paused MinIO makes clients time out rather than hang.
PAUSED_REQUEST_TIMEOUT_S = 1.0


def _minio_pids(data_dir: Path) -> list[int]:
    """Live MinIO processes serving ``data_dir``, found in /proc (not via the launcher)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(data_dir).encode() in argv and b"server" in argv:
            found.append(int(entry.name))
    return found


def _client(server: S3Server, timeout_s: float = 10.0) -> fs.S3FileSystem:
    return fs.S3FileSystem(
        access_key=server.access_key,
        secret_key=server.secret_key,
        endpoint_override=server.endpoint_url,
        scheme="http",
        region=REGION,
        connect_timeout=timeout_s,
        request_timeout=timeout_s,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=1),
    )


def _put(client: fs.S3FileSystem, path: str, data: bytes) -> None:
    with client.open_output_stream(path) as out:
        out.write(data)


def _get(client: fs.S3FileSystem, path: str) -> bytes:
    with client.open_input_stream(path) as source:
        return bytes(source.read())


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "percolake", "s3", *argv],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env=env,
        check=False,
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[S3Server]:
    """A started server of this test's own, stopped at the end whatever the test did."""
    s3 = S3Server(tmp_path / "s3")
    s3.start()
    try:
        yield s3
    finally:
        s3.stop()
        assert _minio_pids(s3.data_dir) == []


def test_start_status_stop_through_the_class(tmp_path: Path) -> None:
    base = tmp_path / "s3"
    server = S3Server(base)
    started = time.monotonic()
    server.start()
    try:
        startup_s = time.monotonic() - started
        assert startup_s < 30, f"MinIO took {startup_s:.1f} s to start"
        status = server.status()
        assert status.ready and status.process_alive and status.pid is not None
        assert status.endpoint_url == server.endpoint_url == f"http://127.0.0.1:{server.port}"
        assert _minio_pids(server.data_dir) == [status.pid]
        # The state file holds the root secret: its owner alone may read it.
        state_file = base / "s3.json"
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert server.secret_key in state_file.read_text()
        assert server.access_key == "percolake"
        assert server.env() == {
            "AWS_ACCESS_KEY_ID": "percolake",
            "AWS_SECRET_ACCESS_KEY": server.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": server.endpoint_url,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        assert (base / "minio.log").is_file()

        # Another handle (as another process would build it) sees and stops the same server.
        other = S3Server.from_dir(base)
        assert (other.port, other.console_port, other.secret_key) == (
            server.port,
            server.console_port,
            server.secret_key,
        )
        assert other.status().ready
        server.start()  # already running: a no-op that still waits for readiness
        assert _minio_pids(server.data_dir) == [status.pid]
        other.stop()
        assert not server.alive() and not server.ready()
        assert _minio_pids(server.data_dir) == []
        after = server.status()
        assert (after.pid, after.process_alive, after.ready) == (None, False, False)
        server.stop()  # idempotent, from either handle
        other.stop()
    finally:
        server.stop()


def test_stop_without_a_start_is_a_no_op(tmp_path: Path) -> None:
    server = S3Server(tmp_path / "never-started")
    server.stop()
    assert not server.alive()
    with pytest.raises(S3Error, match="no port yet"):
        _ = server.endpoint_url
    with pytest.raises(S3Error, match="not running"):
        server.pause()


def test_from_dir_without_a_server_names_the_missing_state(tmp_path: Path) -> None:
    with pytest.raises(S3Error, match=r"no S3 server in .*missing s3\.json"):
        S3Server.from_dir(tmp_path)


def test_cli_start_prints_exports_that_work_alone_and_status_exits_1_when_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "cli"
    started = _cli("start", "--dir", str(base), "--bucket", "exports")
    try:
        assert started.returncode == 0, started.stderr
        lines = started.stdout.splitlines()
        assert lines[0].startswith("# MinIO on http://127.0.0.1:")
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in lines[1:]
            if line.startswith("export ")
        )
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"} <= (
            set(exports)
        )
        assert exports["AWS_EC2_METADATA_DISABLED"] == "true"

        # A client with nothing but the printed variables writes and reads an object.
        client_env = {name: shlex.split(value)[0] for name, value in exports.items()}
        client_env["PATH"] = os.environ["PATH"]
        script = (
            "from pyarrow import fs\n"
            "client, path = fs.FileSystem.from_uri('s3://exports/dir/object.bin')\n"
            "with client.open_output_stream(path) as out: out.write(b'written with exports')\n"
            "with client.open_input_stream(path) as src: print(src.read().decode())\n"
        )
        client = subprocess.run(
            [sys.executable, "-c", script],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == "written with exports"

        # status through the in-process entry point, as `percolake s3 status` runs it.
        assert cli.main(["s3", "status", "--dir", str(base)]) == 0
        up = capsys.readouterr().out
        assert up.endswith(" up\n") and exports["AWS_ENDPOINT_URL"] in up

        stopped = _cli("stop", "--dir", str(base))
        assert stopped.returncode == 0, stopped.stderr
        assert _minio_pids(base / "data") == []
        down = _cli("status", "--dir", str(base))
        assert down.returncode == 1
        assert down.stdout.strip() == f"pid=- {exports['AWS_ENDPOINT_URL']} down"
        assert _cli("stop", "--dir", str(base)).returncode == 0  # idempotent
    finally:
        if (base / "s3.json").is_file():
            S3Server.from_dir(base).stop()


def test_python_m_entry_point_and_status_of_an_empty_dir(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "percolake.tools.s3", "status", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 1
    assert "no S3 server in" in result.stderr


def test_restart_after_kill_keeps_objects_and_endpoint(server: S3Server) -> None:
    server.create_bucket("survives")
    _put(_client(server), "survives/kept.txt", b"still here")
    port, secret = server.port, server.secret_key

    server.kill()
    assert not server.alive() and not server.ready()
    assert _minio_pids(server.data_dir) == []

    server.start()
    assert (server.port, server.secret_key) == (port, secret)
    assert _get(_client(server), "survives/kept.txt") == b"still here"


def test_pause_makes_requests_time_out_and_resume_serves_again(server: S3Server) -> None:
    server.create_bucket("paused")
    _put(_client(server), "paused/object", b"before the pause")

    server.pause()
    try:
        assert server.alive(), "a paused server is still there"
        started = time.monotonic()
        with pytest.raises(OSError):
            _get(_client(server, timeout_s=PAUSED_REQUEST_TIMEOUT_S), "paused/object")
        waited = time.monotonic() - started
        assert waited < 15, f"a request to a paused server hung for {waited:.1f} s"
        assert not server.ready()
    finally:
        server.resume()
    assert server.ready()
    assert _get(_client(server), "paused/object") == b"before the pause"


def test_stop_ends_a_paused_server(server: S3Server) -> None:
    pid = server.status().pid
    server.pause()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < server.stop_timeout_s, "SIGTERM waited for SIGKILL"
    assert pid not in _minio_pids(server.data_dir)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port with a listener on it (not MinIO)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_in_use_is_a_clear_error_and_leaves_no_process(
    tmp_path: Path, busy_port: int
) -> None:
    server = S3Server(tmp_path / "s3", port=busy_port)
    with pytest.raises(S3Error, match=f"127.0.0.1:{busy_port} .*already in use"):
        server.start()
    assert not server.alive()
    assert _minio_pids(server.data_dir) == []

    console = S3Server(tmp_path / "console", console_port=busy_port)
    with pytest.raises(S3Error, match=r"console port.* already in use"):
        console.start()
    assert _minio_pids(console.data_dir) == []

    result = _cli("start", "--dir", str(tmp_path / "cli"), "--port", str(busy_port))
    assert result.returncode == 1
    assert f"127.0.0.1:{busy_port}" in result.stderr and "already in use" in result.stderr
    assert _minio_pids(tmp_path / "cli" / "data") == []


@pytest.mark.parametrize("port", ["0", "65536", "-1", "http"])
def test_a_bad_port_is_rejected_with_exit_2(
    tmp_path: Path, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["s3", "start", "--dir", str(tmp_path), "--port", port])
    assert exit_info.value.code == 2
    assert "--port" in capsys.readouterr().err
    assert not (tmp_path / "s3.json").exists()


def test_a_bad_port_in_the_constructor_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="port must be between 1 and 65535, got 70000"):
        S3Server(tmp_path, port=70000)
    with pytest.raises(ValueError, match="must differ"):
        S3Server(tmp_path, port=9000, console_port=9000)


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("ab", "3 to 63 characters"),
        ("a" * 64, "3 to 63 characters"),
        ("My-Bucket", "lowercase letters"),
        ("under_score", "lowercase letters"),
        ("-leading", "begin and end"),
        ("trailing.", "begin and end"),
        ("two..dots", "'..'"),
        ("dot.-dash", "'.-'"),
        ("192.168.5.4", "IP address"),
        ("xn--bucket", "reserves"),
        ("bucket-s3alias", "reserves"),
    ],
)
def test_bad_bucket_names_name_the_rule(name: str, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        validate_bucket_name(name)


def test_good_bucket_names_pass() -> None:
    for name in ("abc", "pl-gw0-12", "my.bucket.name", "a" * 63):
        validate_bucket_name(name)


def test_create_bucket_rejects_a_bad_name_before_any_request(server: S3Server) -> None:
    with pytest.raises(ValueError, match="lowercase letters"):
        server.create_bucket("Bad_Bucket")
    assert _client(server).get_file_info(fs.FileSelector("/")) == []
    assert server.create_bucket("good-bucket") == "good-bucket"
    assert server.create_bucket("good-bucket") == "good-bucket"  # exists already: fine
    buckets = _client(server).get_file_info(fs.FileSelector("/"))
    assert [info.path for info in buckets] == ["good-bucket"]


def test_cli_rejects_a_bad_bucket_name_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["s3", "start", "--dir", str(tmp_path), "--bucket", "Bad_Name"])
    assert exit_info.value.code == 2
    assert "bucket name 'Bad_Name'" in capsys.readouterr().err
    assert not (tmp_path / "s3.json").exists()


@pytest.mark.parametrize(
    ("argv", "extras"),
    [
        (("s3", "fetch"), []),
        (("s3", "start"), []),
        (("s3", "status"), []),
        (("s3", "stop", "--dir", "d"), []),
        (("s3", "start", "--bucket", "warehouse"), ["spark"]),  # buckets are made via pyarrow
    ],
)
def test_extras_needed_by_the_s3_command(argv: tuple[str, ...], extras: list[str]) -> None:
    assert cli.extras_needed(cli._build_parser().parse_args(list(argv))) == extras


def test_ensure_minio_is_a_cache_hit_the_second_time() -> None:
    first = ensure_minio()
    assert first == minio_binary(DEFAULT_VERSION)
    assert minio_present(DEFAULT_VERSION)
    assert (first.parent.parent / ".complete").is_file()
    assert os.access(first, os.X_OK)
    started = time.monotonic()
    # A go that does not exist: a cache hit must not need the toolchain at all.
    second = ensure_minio(go="/nonexistent/go")
    assert second == first
    assert time.monotonic() - started < 1.0


def test_without_a_go_toolchain_the_error_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(S3Error, match=r"no Go toolchain .*go install github.com/minio/minio@"):
        ensure_minio(home=tmp_path, go="no-such-go-toolchain")
    assert not minio_present(home=tmp_path)


def test_a_failed_build_shows_the_command_and_its_output_and_leaves_no_cache(
    tmp_path: Path,
) -> None:
    """A version the module proxy does not have: ``go install`` fails within a second
    (offline too: then it cannot reach the proxy), and nothing is taken for a cache."""
    with pytest.raises(S3Error) as error:
        ensure_minio("not-a-version", home=tmp_path)
    message = str(error.value)
    assert "go install failed" in message
    assert "go install github.com/minio/minio@not-a-version" in message
    assert "not-a-version" in message.split("\n", 2)[2]  # go's own output follows
    assert not minio_present("not-a-version", home=tmp_path)
    assert not minio_binary("not-a-version", home=tmp_path).exists()


# --- the session fixtures of tests/s3_plugin.py ------------------------------------------


def test_session_fixtures_give_an_empty_bucket_and_the_aws_environment(
    s3_server: S3Server, s3_bucket: str, s3_warehouse: str
) -> None:
    for name, value in s3_server.env().items():
        assert os.environ[name] == value
    assert s3_warehouse == f"s3://{s3_bucket}/warehouse"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert s3_bucket.startswith(f"pl-{worker}-")
    # The standard variables alone are enough for a client.
    client, path = fs.FileSystem.from_uri(s3_warehouse)
    assert client.get_file_info(fs.FileSelector(s3_bucket, recursive=True)) == []
    _put(client, f"{path}/part-0.parquet", b"data")
    assert _get(client, f"{path}/part-0.parquet") == b"data"


def test_each_test_gets_a_fresh_bucket(s3_server: S3Server, s3_bucket: str) -> None:
    client = _client(s3_server)
    assert client.get_file_info(fs.FileSelector(s3_bucket, recursive=True)) == []
    assert s3_bucket in [info.path for info in client.get_file_info(fs.FileSelector("/"))]
