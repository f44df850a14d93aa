"""A deadlock between two real client processes through one gateway (issue 28).

One ``percolake serve`` (role all, SQLite) and two client subprocesses, each with its
own ``TransactionManager.remote``: A locks x then y with ``get_for_update``, B locks y
then x. They meet through files in a shared folder, so that each holds its first lock
before either asks for its second, and every wait is bounded. The lock server's
wait-for graph must find the cycle: exactly one of them is the victim
(``DeadlockError``, reason ``deadlock``), the other gets the lock its victim released
and commits, and what it wrote is what a reader sees afterwards. The in-process twin,
two remote transactions of one process, is in ``test_pessimistic_remote.py``.

The client is :func:`client_main` of this module, run as ``python -c`` from the
project's root; it prints its outcome as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import ServerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TABLE = "t"
COLUMN = b"v"
X, Y = b"pp-x", b"pp-y"
#: Bound on every wait: a client for the other's first lock, the test for a client.
WAIT_S = 60.0
#: Longer than any wait the deadlock needs: the waiter that is not the victim must
#: get its lock once the victim releases, not time out first.
LOCK_WAIT_MS = 20_000


def client_main() -> int:
    """One client: ``ADDRESS NAME FIRST SECOND FOLDER OTHER``. Locks FIRST, says so in
    ``FOLDER/NAME.locked``, waits for ``FOLDER/OTHER.locked``, locks SECOND; then writes
    NAME to both cells and commits. Prints ``{"name", "outcome", ...}``."""
    from txn import TransactionManager
    from txn.errors import DeadlockError

    address, name, first, second, folder, other = sys.argv[1:7]
    result: dict[str, Any] = {"name": name}
    with TransactionManager.remote(address) as tm:
        tx = tm.begin()
        try:
            result["first_read"] = _text(tx.get_for_update(TABLE, first.encode(), COLUMN))
            _say(Path(folder) / f"{name}.locked")
            if not _wait_for(Path(folder) / f"{other}.locked"):
                result["outcome"] = "no-partner"
                tx.abort()
            else:
                result["second_read"] = _text(tx.get_for_update(TABLE, second.encode(), COLUMN))
                tx.put(TABLE, first.encode(), COLUMN, name.encode())
                tx.put(TABLE, second.encode(), COLUMN, name.encode())
                result.update(outcome="committed", commit_ts=tx.commit())
        except DeadlockError as exc:
            result.update(
                outcome="deadlock", reason=exc.reason, status=tx.status.name, error=str(exc)
            )
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _say(path: Path) -> None:
    partial = path.with_suffix(".tmp")
    partial.write_text("1")
    partial.replace(path)


def _wait_for(path: Path) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        "all",
        ["--store", f"sqlite:///{tmp_path}/gw.db", "--lock-wait-ms", str(LOCK_WAIT_MS)],
        tmp_path,
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Client processes a test starts; any still running at teardown is killed (by pid)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_deadlock_between_two_client_processes_aborts_one_and_commits_the_other(
    gateway: ServerProcess, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    from txn import TransactionManager

    with TransactionManager.remote(gateway.address) as tm:
        with tm.begin() as tx:
            tx.put(TABLE, X, COLUMN, b"init")
            tx.put(TABLE, Y, COLUMN, b"init")
            tx.commit()
        folder = tmp_path / "meet"
        folder.mkdir()
        code = f"import sys; from {__name__} import client_main; sys.exit(client_main())"
        for name, first, second, other in (("A", X, Y, "B"), ("B", Y, X, "A")):
            argv = [gateway.address, name, first.decode(), second.decode(), str(folder), other]
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, *argv],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        results: dict[str, dict[str, Any]] = {}
        for proc in children:
            out, err = proc.communicate(timeout=WAIT_S + 30)
            assert proc.returncode == 0, f"client exited {proc.returncode}:\n{err[-3000:]}"
            got = json.loads(out.strip().splitlines()[-1])
            results[got["name"]] = got

        outcomes = sorted(r["outcome"] for r in results.values())
        assert outcomes == ["committed", "deadlock"], results
        (victim,) = (r for r in results.values() if r["outcome"] == "deadlock")
        (winner,) = (r for r in results.values() if r["outcome"] == "committed")
        assert victim["reason"] == "deadlock" and victim["status"] == "ABORTED", victim
        # The winner read the committed values under its locks: the victim wrote nothing.
        assert winner["first_read"] == winner["second_read"] == "init", winner
        with tm.begin() as tx:
            assert tx.get(TABLE, X, COLUMN) == winner["name"].encode()
            assert tx.get(TABLE, Y, COLUMN) == winner["name"].encode()
            assert tx.start_ts > winner["commit_ts"]
