"""tests/cpu_plugin.py counts the CPU of a test's child processes, live or reaped."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.cpu_plugin import _tree_cpu_s

BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"


def test_a_child_that_burns_cpu_counts_while_it_runs_and_once_reaped() -> None:
    before = _tree_cpu_s(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", BURN + "import time; time.sleep(30)"])
    try:
        # Live: the child's own ticks, found by walking the process tree.
        for _ in range(100):
            if _tree_cpu_s(os.getpid()) - before >= 0.4:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert _tree_cpu_s(os.getpid()) - before >= 0.4
    finally:
        child.kill()
        child.wait()
    # Reaped: in this process's children times.
    done = subprocess.run([sys.executable, "-c", BURN], check=True)
    assert done.returncode == 0
    assert _tree_cpu_s(os.getpid()) - before >= 0.9
