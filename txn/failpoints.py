"""Named fault-injection points in the real commit path, switched on only by tests.

Each step of the commit protocol calls ``failpoints.hit(name, start_ts)`` after it
finishes. Nothing happens unless a test enabled that point with an action: pause
(block on an event or sleep), crash (raise :class:`SimulatedCrash`, which the
protocol never catches, so the transaction is abandoned exactly as a dying
process would abandon it), or any callable, such as one raising
``StoreTimeoutError`` to drop the reply of the commit point.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

#: Points in commit order (docs/design/protocol.md, "The commit protocol").
AFTER_LOCK = "after_lock"
AFTER_WRITE = "after_write"
AFTER_CONFLICT_CHECK = "after_conflict_check"
AFTER_COMMIT_TS = "after_commit_ts"
BEFORE_COMMIT_POINT = "before_commit_point"
AFTER_COMMIT_POINT = "after_commit_point"
AFTER_RELEASE = "after_release"
#: Inside settlement of an ambiguous commit point (rule S6), before each attempt.
SETTLE_COMMIT = "settle_commit"

POINTS = (
    AFTER_LOCK,
    AFTER_WRITE,
    AFTER_CONFLICT_CHECK,
    AFTER_COMMIT_TS,
    BEFORE_COMMIT_POINT,
    AFTER_COMMIT_POINT,
    AFTER_RELEASE,
    SETTLE_COMMIT,
)

Action = Callable[[int], None]

#: What identifies the work at a point: a start timestamp here, a job id in the lakehouse.
K = TypeVar("K")


class SimulatedCrash(BaseException):
    """Raised by the ``crash`` action: the committing process "dies" at that point.

    Derives from ``BaseException`` so that no ``except Exception`` cleanup in the
    protocol runs: locks stay held until their lease ends, versions stay behind.
    """


def crash() -> Action:
    def act(start_ts: int) -> None:
        raise SimulatedCrash(f"simulated crash of transaction {start_ts}")

    return act


def pause(
    seconds: float | None = None,
    *,
    until: threading.Event | None = None,
    reached: threading.Event | None = None,
) -> Action:
    """Block the committer for ``seconds``, or until ``until`` is set (``seconds`` caps it).

    ``reached`` is set when the committer arrives, so a test can act while it waits.
    """

    def act(start_ts: int) -> None:
        if reached is not None:
            reached.set()
        if until is not None:
            until.wait(seconds)
        elif seconds is not None:
            time.sleep(seconds)

    return act


def raise_error(error: Callable[[], BaseException]) -> Callable[[object], None]:
    """Make the step fail with ``error()``; works at any registry's points (any key)."""

    def act(key: object) -> None:
        raise error()

    return act


class FailPoints(Generic[K]):
    """A registry of enabled points; one per transaction manager, empty by default.

    Generic over the key each point is hit with, so that other commit paths (the
    lakehouse's) reuse it with their own point names.
    """

    def __init__(self, points: Sequence[str] = POINTS) -> None:
        self._points = tuple(points)
        self._actions: dict[
            str, tuple[Callable[[K], None], int | None, Callable[[K], bool] | None]
        ] = {}
        self._lock = threading.Lock()

    def enable(
        self,
        name: str,
        action: Callable[[K], None],
        *,
        times: int | None = None,
        only: Callable[[K], bool] | None = None,
    ) -> None:
        """Run ``action`` at ``name``: at most ``times`` times, only where ``only(key)``."""
        if name not in self._points:
            raise ValueError(f"unknown fail point {name!r}; known: {', '.join(self._points)}")
        if times is not None and times < 1:
            raise ValueError(f"times must be positive, got {times}")
        with self._lock:
            self._actions[name] = (action, times, only)

    def disable(self, name: str | None = None) -> None:
        with self._lock:
            if name is None:
                self._actions.clear()
            else:
                self._actions.pop(name, None)

    def hit(self, name: str, key: K) -> None:
        if not self._actions:  # the fast path of every production commit
            return
        with self._lock:
            entry = self._actions.get(name)
            if entry is None:
                return
            action, times, only = entry
            if only is not None and not only(key):
                return
            if times is not None:
                if times <= 1:
                    del self._actions[name]
                else:
                    self._actions[name] = (action, times - 1, only)
        action(key)
