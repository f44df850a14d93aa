"""Named fault-injection points in the lakehouse commit path, switched on only by tests.

Like :mod:`txn.failpoints`: each step of ``append``/``overwrite`` calls
``failpoints.hit(name, job_id)`` when it is done. Nothing happens unless a test
enabled that point. :func:`crash` raises :class:`SimulatedCrash`, a
``BaseException`` that no cleanup in the commit path catches, so the job is
abandoned exactly as a dying driver would abandon it (its files stay behind).
"""

from __future__ import annotations

from collections.abc import Callable

from txn import failpoints as _txn_failpoints
from txn.failpoints import SimulatedCrash

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


def crash() -> Action:
    def act(job_id: str) -> None:
        raise SimulatedCrash(f"simulated crash of lakehouse job {job_id}")

    return act


class FailPoints(_txn_failpoints.FailPoints[str]):
    """Enabled points of one :class:`~spark_integration.Lakehouse`, hit with job ids;
    the registry of :mod:`txn.failpoints` with the lakehouse's point names."""

    def __init__(self) -> None:
        super().__init__(POINTS)


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
