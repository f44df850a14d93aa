"""The wheel, installed with its core dependencies only, runs every command (issue 30 item 9).

``pip install percolake`` without extras must leave every ``percolake`` command working, or
saying which extra it needs (exit 2, no traceback). The wheel is built from the working
tree (copied first: setuptools' ``build/`` folder in a checkout can carry deleted modules
into a wheel), installed once per session into a new venv from PyPI through pip's cache,
and run from a folder outside the checkout so nothing of the checkout is importable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from percolake.cli import EXTRA_MODULES, _build_parser

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # 14 s on a quiet machine, 35 s loaded

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 60.0
#: Modules of the extras and of the dev tools; none may be importable in the clean venv,
#: or the test would not show what a core-only install does.
NOT_INSTALLED = (
    *(module for modules in EXTRA_MODULES.values() for module in modules),
    "matplotlib",
    "hypothesis",
    "pytest",
)


@dataclass(frozen=True)
class CleanVenv:
    root: Path
    workdir: Path

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def percolake(self) -> str:
        return str(self.root / "bin" / "percolake")

    def env(self) -> dict[str, str]:
        drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP"}
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run(
        self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run a command of the venv in a session of its own; whatever it started and
        left behind (a regression that launches what it should refuse) is killed with
        its process group, by that group's id."""
        proc = subprocess.Popen(
            args,
            cwd=self.workdir,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.wait(10)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _copy_source(dest: Path) -> None:
    """The files the wheel is built from, as they are in the working tree."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {pattern.rstrip("*") for pattern in packages}
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for top in sorted(tops):
        shutil.copytree(
            ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )


@pytest.fixture(scope="session")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> CleanVenv:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"
    _copy_source(source)
    dist = base / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # Build isolation fetches the build backend the project declares (through pip's
    # cache), so the wheel does not depend on what this venv happens to hold.
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dist), str(source)], check=True)
    (wheel,) = dist.glob("percolake-*.whl")
    venv = base / "venv"
    # No pip inside: this venv's pip installs into it (pip --python), which saves
    # ensurepip's seconds and keeps the venv to the wheel and its dependencies.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [*pip, "--python", str(venv / "bin" / "python"), "install", str(wheel)], check=True
    )
    workdir = base / "work"
    workdir.mkdir()
    return CleanVenv(venv, workdir)


def test_clean_venv_holds_the_wheel_and_no_extras(clean_venv: CleanVenv) -> None:
    """The checks below mean something only if the venv really is core-only."""
    probe = (
        "import importlib.util, json, percolake; "
        f"print(json.dumps([percolake.__file__, "
        f"[m for m in {list(NOT_INSTALLED)!r} if importlib.util.find_spec(m)]]))"
    )
    done = clean_venv.run(clean_venv.python, "-c", probe)
    assert done.returncode == 0, done.stderr
    location, present = json.loads(done.stdout)
    assert Path(location).is_relative_to(clean_venv.root), location
    assert present == []


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command line of the parser tree, sub-actions and serve's roles included."""
    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
        elif not action.option_strings and action.choices and action.dest == "role":
            for role in action.choices:
                yield (*prefix, str(role))


ALL_COMMANDS = sorted(set(_commands(_build_parser())))


def test_every_command_has_help(clean_venv: CleanVenv) -> None:
    """Fails on the code before item 9 only if a parser imported an extra; the --help of
    every command (found by walking the parser, so a new one is covered) exits 0."""
    assert ("gc",) in ALL_COMMANDS and ("serve", "txn") in ALL_COMMANDS
    script = (
        "import contextlib, io, json, sys\n"
        "from percolake.cli import main\n"
        "failed = []\n"
        f"for command in {[list(c) for c in ALL_COMMANDS]!r}:\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            main([*command, '--help'])\n"
        "    except SystemExit as exc:\n"
        "        if exc.code != 0 or 'usage: percolake' not in out.getvalue():\n"
        "            failed.append([command, exc.code])\n"
        "    else:\n"
        "        failed.append([command, 'no exit'])\n"
        "print(json.dumps(failed))\n"
    )
    done = clean_venv.run(clean_venv.python, "-c", script)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    # and once through the console script the wheel installs
    console = clean_venv.run(clean_venv.percolake, "--help")
    assert console.returncode == 0, console.stderr
    assert "serve" in console.stdout and "gc" in console.stdout


HISTORY = [
    {"index": 0, "type": "invoke", "process": 0, "f": "txn", "value": [["append", "k", 1]]},
    {"index": 1, "type": "ok", "process": 0, "f": "txn", "value": [["append", "k", 1]]},
    {"index": 2, "type": "invoke", "process": 1, "f": "txn", "value": [["r", "k", None]]},
    {"index": 3, "type": "ok", "process": 1, "f": "txn", "value": [["r", "k", [1]]]},
]


def test_check_runs_on_a_tiny_history(clean_venv: CleanVenv, tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(op) + "\n" for op in HISTORY))
    done = clean_venv.run(clean_venv.percolake, "check", str(history), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["anomalies"] == []


COMMIT_TWICE = """
import sys
from txn import TransactionManager
tm = TransactionManager.remote(sys.argv[1])
for value in (b"one", b"two"):
    with tm.begin() as tx:
        tx.put("t", b"row", b"col", value)
with tm.begin() as tx:
    assert tx.get("t", b"row", b"col") == b"two"
tm.close()
print("committed")
"""


def test_serve_status_and_gc_smoke(clean_venv: CleanVenv, tmp_path: Path) -> None:
    """Fails on the code before item 9: ``percolake gc`` imported tqdm, a dev-only
    dependency, so it died with ModuleNotFoundError in a venv with the wheel alone.

    ``serve`` starts on a temporary SQLite store and a free loopback port, a client from
    the same venv commits twice to one cell, ``status`` names the leader, SIGTERM (by
    pid) stops it cleanly, and ``gc`` at retention 0 sweeps the overwritten version.
    """
    store = f"sqlite:///{tmp_path}/store.db"
    ready = tmp_path / "ready"
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [
                clean_venv.percolake,
                "serve",
                "--store",
                store,
                "--listen",
                "127.0.0.1:0",
                "--ready-file",
                str(ready),
                "--grace-s",
                "5",
            ],
            cwd=clean_venv.workdir,
            env=clean_venv.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (ready.exists() and ready.read_text().strip()):
            assert server.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        address = f"127.0.0.1:{int(ready.read_text())}"

        client = clean_venv.run(clean_venv.python, "-c", COMMIT_TWICE, address)
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == "committed"

        status = clean_venv.run(clean_venv.percolake, "status", "--gateway", address, "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert address in status.stdout
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
        try:
            code = server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
            raise
    assert code == 0, log_path.read_text()
    assert "Traceback" not in log_path.read_text()

    gc = clean_venv.run(
        clean_venv.percolake,
        "gc",
        "--store",
        store,
        "--retention-s",
        "0",
        "--grace-ms",
        "0",
        "--json",
    )
    assert gc.returncode == 0, gc.stderr
    report = json.loads(gc.stdout)
    assert report["versions_deleted"] >= 1, report
    assert "Traceback" not in gc.stderr
    plain = clean_venv.run(
        clean_venv.percolake, "gc", "--store", store, "--retention-s", "0", "--grace-ms", "0"
    )
    assert plain.returncode == 0, plain.stderr
    assert "safe point" in plain.stdout


#: A command of each kind that needs an extra, and the extras it must name.
NEEDS_EXTRA = [
    (("demo",), "percolake demo", ["spark"]),
    (("gc", "--store", "cassandra://127.0.0.1/ks"), "percolake gc", ["cassandra"]),
    (("serve", "--store", "cassandra://127.0.0.1/ks"), "percolake serve", ["cassandra"]),
    (
        ("serve", "tso", "--store", "cassandra://127.0.0.1/ks", "--listen", "127.0.0.1:0"),
        "percolake serve",
        ["cassandra"],
    ),
    (
        ("chaos", "run", "--workload", "lakehouse", "--duration-s", "1", "--out", "o"),
        "percolake chaos run",
        ["spark"],
    ),
    (
        (
            "chaos",
            "run",
            "--workload",
            "bank",
            "--store",
            "cassandra://127.0.0.1:1/k",
            "--out",
            "o",
        ),
        "percolake chaos run",
        ["cassandra"],
    ),
    # Nothing here may start a Cassandra node if the check regressed (a node runs in a
    # session of its own): a store URL on port 1, not --cassandra-nodes; the launcher's
    # status, not start; the suite with a run name that matches nothing.
    # tests/unit/test_cli_extras.py covers those in-process.
    (
        ("chaos", "suite", "--out", "o", "--work-dir", "o", "--only", "none"),
        "percolake chaos suite",
        ["cassandra", "spark"],
    ),
    (("cassandra", "status", "--dir", "c"), "percolake cassandra status", ["cassandra"]),
]


@pytest.mark.parametrize(
    ("argv", "command", "extras"),
    NEEDS_EXTRA,
    ids=[" ".join(argv[:2]) + f"-{i}" for i, (argv, _, _) in enumerate(NEEDS_EXTRA)],
)
def test_a_command_needing_an_extra_names_it(
    clean_venv: CleanVenv, argv: tuple[str, ...], command: str, extras: list[str]
) -> None:
    """Fails on the code before item 9: ``demo`` died with ModuleNotFoundError (pyspark)
    after printing a traceback, ``serve``/``gc`` on cassandra:// with an ImportError
    traceback, and ``chaos run --workload lakehouse`` as a harness error (exit 3)."""
    done = clean_venv.run(clean_venv.percolake, *argv)
    names = " and ".join(f"'{e}'" for e in extras)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{command} needs the {names} extra" in done.stderr
    assert f"pip install 'percolake[{','.join(extras)}]'" in done.stderr
    assert "Traceback" not in done.stderr
    # Nothing was started: no folder of the run's output, no cluster directory.
    assert not (clean_venv.workdir / "o").exists()
    assert not (clean_venv.workdir / "c").exists()
