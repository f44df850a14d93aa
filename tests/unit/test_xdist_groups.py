"""``make test`` keeps the tests that share a JVM in one xdist worker (tests/conftest.py
marks them with ``xdist_group`` in ``pytest_collection_modifyitems``). If that stops
working nothing fails: every worker starts its own Cassandra nodes and Spark session
and the suite only gets slower. That happened with pytest 9.2 (pytest-xdist issue 1386).
This runs the same mechanism in a small suite of its own and checks where tests ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "shared" in item.name:
            item.add_marker(pytest.mark.xdist_group("jvm"))
"""

_TESTS = """
import json, os, pathlib, pytest

@pytest.mark.parametrize("i", range(6))
def test_shared(i):
    out = pathlib.Path(os.environ["WHERE_DIR"]) / f"shared-{i}.json"
    out.write_text(json.dumps(os.environ["PYTEST_XDIST_WORKER"]))

@pytest.mark.parametrize("i", range(6))
def test_single(i):
    pass
"""


def test_tests_marked_with_one_group_in_a_hook_run_in_one_worker(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(_CONFTEST)
    (suite / "test_where.py").write_text(_TESTS)
    where = tmp_path / "where"
    where.mkdir()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3"]
    command += ["--dist", "loadgroup", "-c", "/dev/null", "--rootdir", str(suite), str(suite)]
    env = {**os.environ, "WHERE_DIR": str(where)}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = {json.loads(p.read_text()) for p in where.glob("shared-*.json")}
    assert len(list(where.glob("shared-*.json"))) == 6
    assert len(workers) == 1, f"the group's tests ran on {sorted(workers)}"
