"""The chaos report counts a deposed leader even when the watcher read the row too late.

On SQLite a deposed leader row is taken over within tens of milliseconds, often between
two reads of the harness's watcher; the landing CI of 2026-11-27 saw the deposition in a
replica's log and never in the row, and the partitioned-leader test failed on it.
"""

from __future__ import annotations

from pathlib import Path

from percolake.tools.chaos._replicas import LeaderWatch

DEPOSER = (
    "2026-11-27 19:55:59,582 WARNING tso._lease: 127.0.0.1:36775 deposed tso leader "
    "127.0.0.1:41167 (epoch 1): 127.0.0.1:41167 unreachable from here: Deadline Exceeded\n"
)
DEPOSED = (
    "2026-11-27 19:55:59,611 INFO tso._lease: 127.0.0.1:41167: tso leader 127.0.0.1:41167 "
    "(this replica) of epoch 1 was deposed\n"
)


def test_a_deposition_logged_by_a_replica_counts(tmp_path: Path) -> None:
    watch = LeaderWatch(f"sqlite:///{tmp_path}/store.db")
    summary = watch.summary({}, [DEPOSER, DEPOSED, DEPOSER])
    assert (summary["deposed"], summary["deposed_in_row"]) == (1, 0)


def test_no_deposition_without_one_logged_or_seen(tmp_path: Path) -> None:
    watch = LeaderWatch(f"sqlite:///{tmp_path}/store.db")
    # The deposed leader's own line is not a deposition by another replica.
    assert watch.summary({}, [DEPOSED])["deposed"] == 0
    assert watch.summary({})["deposed"] == 0
