"""A gateway's follow-up queue writes only the newest checkpoint due (issue 27): a queue
that fell behind the commits skips the stale checkpoints of a generation, and the
expiries after them, for the newest one queued, which it does write; embedded
follow-ups (no queue) write every one."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from spark_integration.engine import follow_ups as fu
from spark_integration.engine.follow_ups import FollowUps, NewVersion

pytestmark = pytest.mark.unit


class _Hits:
    def hit(self, point: str, job_id: str) -> None:
        pass


def _follow_ups(
    monkeypatch: pytest.MonkeyPatch, run_later: Callable[[Callable[[], None]], object] | None
) -> tuple[FollowUps, list[tuple[str, int, int]], list[str]]:
    written: list[tuple[str, int, int]] = []
    expired: list[str] = []

    def write_checkpoint(
        tm: Any, layout: Any, name: str, gen: int, gen_start: int, version: int
    ) -> None:
        written.append((name, gen, version))

    monkeypatch.setattr(fu, "write_checkpoint", write_checkpoint)
    tables: Any = SimpleNamespace(failpoints=_Hits(), tm=None, layout=None)
    expiry: Any = None
    follow_ups = FollowUps(tables, expiry, run_later=run_later, record_commit_ts=False)
    monkeypatch.setattr(follow_ups, "_expire_quietly", expired.append)
    return follow_ups, written, expired


def _v(version: int, gen: int = 0) -> NewVersion:
    return NewVersion(version, f"job{version}", gen, 0)


def test_a_queue_behind_the_commits_writes_only_the_newest_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue: list[Callable[[], None]] = []
    follow_ups, written, expired = _follow_ups(monkeypatch, queue.append)
    for version in (100, 150, 200, 300):
        follow_ups.schedule("t", [_v(version)], None)
    follow_ups.schedule("u", [_v(100)], None)
    for work in queue:
        work()
    assert written == [("t", 0, 300), ("u", 0, 100)]
    assert expired == ["t", "u"]
    # Nothing is left to skip: the next checkpoint due is written.
    queue.clear()
    follow_ups.schedule("t", [_v(400)], None)
    queue[0]()
    assert written[-1] == ("t", 0, 400)


def test_a_queue_that_keeps_up_writes_every_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    follow_ups, written, expired = _follow_ups(monkeypatch, lambda work: work())
    for version in (100, 200, 300):
        follow_ups.schedule("t", [_v(version)], None)
    assert [v for _, _, v in written] == [100, 200, 300]
    assert expired == ["t"] * 3


def test_embedded_follow_ups_write_every_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    follow_ups, written, _ = _follow_ups(monkeypatch, None)
    follow_ups.schedule("t", [_v(100), _v(150)], None)
    follow_ups.schedule("t", [_v(200, gen=1)], None)
    assert written == [("t", 0, 100), ("t", 1, 200)]
