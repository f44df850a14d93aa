"""Named fault-injection points in the lakehouse commit path, switched on only by tests.

Like :mod:`txn.failpoints`: each step of ``append``/``overwrite`` calls
``failpoints.hit(name, job_id)`` when it is done. Nothing happens unless a test
enabled that point. :func:`crash` raises :class:`SimulatedCrash`, a
``BaseException`` that no cleanup in the commit path catches, so the job is
abandoned exactly as a dying driver would abandon it (its files stay behind).
:func:`raise_error` makes a step fail with any exception, such as the
``StoreError``, ``OracleFencedError`` or ``ServiceUnavailableError`` that a
follow-up transaction meets.

The points from :data:`SETTLE_COMMIT` on sit in the catalog (``Catalog.failpoints``,
the same registry as ``Lakehouse.failpoints``), so they are hit by ``append_files``
too, keyed by its job id. The catalog runs in the client process, with a remote
manager as well, so tests can arm them there.
"""

from __future__ import annotations

from collections.abc import Callable

from txn import failpoints as _txn_failpoints
from txn.failpoints import SimulatedCrash, raise_error

#: The staging folder's name is chosen and the job's start time taken; nothing written.
BEFORE_WRITE = "before_write"
#: Spark wrote every data file; nothing was collected or committed.
AFTER_WRITE = "after_write"
#: Files and footers were collected; the commit transaction is about to begin.
BEFORE_COMMIT = "before_commit"
#: The commit transaction's outcome is unknown (rule S6); the catalog is about to
#: settle it through the manager's fencing ``outcome(txn_id, settle=True)``.
SETTLE_COMMIT = "settle_commit"
#: The commit transaction committed (or was settled as committed); nothing of the
#: follow-up work has run. From here on nothing may delete the job's files or
#: report the commit as failed.
AFTER_COMMIT_POINT = "after_commit_point"
#: Follow-up: the version's commit timestamp is about to be recorded (history only).
BEFORE_RECORD_COMMIT_TS = "before_record_commit_ts"
#: Follow-up: a checkpoint is due at this version and about to be written.
BEFORE_CHECKPOINT = "before_checkpoint"
#: Follow-up: a checkpoint was due; expiry (``Catalog.expire``) is about to run.
BEFORE_EXPIRE = "before_expire"
#: The commit and its follow-up work are done; ``append``/``overwrite`` is about to return.
AFTER_COMMIT = "after_commit"

POINTS = (
    BEFORE_WRITE,
    AFTER_WRITE,
    BEFORE_COMMIT,
    SETTLE_COMMIT,
    AFTER_COMMIT_POINT,
    BEFORE_RECORD_COMMIT_TS,
    BEFORE_CHECKPOINT,
    BEFORE_EXPIRE,
    AFTER_COMMIT,
)
#: The points after the commit point: a failure at any of them must leave the
#: version committed and reported as committed.
FOLLOW_UP_POINTS = (
    AFTER_COMMIT_POINT,
    BEFORE_RECORD_COMMIT_TS,
    BEFORE_CHECKPOINT,
    BEFORE_EXPIRE,
)

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
    "AFTER_COMMIT_POINT",
    "AFTER_WRITE",
    "BEFORE_CHECKPOINT",
    "BEFORE_COMMIT",
    "BEFORE_EXPIRE",
    "BEFORE_RECORD_COMMIT_TS",
    "BEFORE_WRITE",
    "FOLLOW_UP_POINTS",
    "POINTS",
    "SETTLE_COMMIT",
    "FailPoints",
    "SimulatedCrash",
    "crash",
    "raise_error",
]
