"""Named fault-injection points in the lakehouse commit path, switched on only by tests.

Like :mod:`txn.failpoints`: each step of ``append``/``overwrite`` calls
``failpoints.hit(name, job_id)`` when it is done. Nothing happens unless a test
enabled that point. :func:`crash` raises :class:`SimulatedCrash`, a
``BaseException`` that no cleanup in the commit path catches, so the job is
abandoned exactly as a dying driver would abandon it (its files stay behind).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

#: The staging folder's name is chosen and the job's start time taken; nothing written.
BEFORE_WRITE = "before_write"
#: Spark wrote every data file; nothing was collected or committed.
AFTER_WRITE = "after_write"
#: Files and footers were collected; the commit transaction is about to begin.
BEFORE_COMMIT = "before_commit"
#: The commit transaction committed.
AFTER_COMMIT = "after_commit"

POINTS = (BEFORE_WRITE, AFTER_WRITE, BEFORE_COMMIT, AFTER_COMMIT)

Action = Callable[[str], None]


class SimulatedCrash(BaseException):
    """The driver "dies" at a fail point; see the module docstring."""


def crash() -> Action:
    def act(job_id: str) -> None:
        raise SimulatedCrash(f"simulated crash of lakehouse job {job_id}")

    return act


class FailPoints:
    """Enabled points of one :class:`~spark_integration.Lakehouse`; empty by default."""

    def __init__(self) -> None:
        self._actions: dict[str, tuple[Action, int | None]] = {}
        self._lock = threading.Lock()

    def enable(self, name: str, action: Action, *, times: int | None = None) -> None:
        """Run ``action(job_id)`` at ``name``, at most ``times`` times (always if None)."""
        if name not in POINTS:
            raise ValueError(f"unknown fail point {name!r}; known: {', '.join(POINTS)}")
        if times is not None and times < 1:
            raise ValueError(f"times must be positive, got {times}")
        with self._lock:
            self._actions[name] = (action, times)

    def disable(self, name: str | None = None) -> None:
        with self._lock:
            if name is None:
                self._actions.clear()
            else:
                self._actions.pop(name, None)

    def hit(self, name: str, job_id: str) -> None:
        if not self._actions:
            return
        with self._lock:
            entry = self._actions.get(name)
            if entry is None:
                return
            action, times = entry
            if times is not None:
                if times <= 1:
                    del self._actions[name]
                else:
                    self._actions[name] = (action, times - 1)
        action(job_id)


__all__ = [
    "AFTER_COMMIT",
    "AFTER_WRITE",
    "BEFORE_COMMIT",
    "BEFORE_WRITE",
    "POINTS",
    "FailPoints",
    "SimulatedCrash",
    "crash",
]
