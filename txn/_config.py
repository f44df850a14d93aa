from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """Tuning of the commit protocol. Units are in the names.

    None of these affects safety (rule S5): they trade aborts against waiting.
    """

    #: Lease on the locks a committing transaction holds; must cover one commit.
    lease_ms: int = 30_000
    #: How long a committer waits for another committer's locks on the same cells.
    lock_wait_ms: int = 10_000
    #: How long a reader waits on a live committer before settling it as aborted.
    resolve_wait_ms: int = 5_000
    #: Attempts to settle an ambiguous commit point before CommitUnknownError (S6).
    settle_attempts: int = 5
    #: Pause between those attempts.
    settle_backoff_ms: int = 50
    #: A remote client whose Commit reply was lost asks a gateway for the outcome
    #: (Status with settle, which fences) this many times, pausing between them:
    #: long enough together to ride over a gateway restart.
    gateway_settle_attempts: int = 10
    gateway_settle_pause_ms: int = 200
    #: Cells scanned per page.
    scan_page_size: int = 500
    #: Commit statuses remembered (they never change once written).
    status_cache_size: int = 200_000
    #: How often a manager publishes its oldest open transaction for garbage
    #: collection (rule S8; liveness only: a late one may cost a SnapshotTooOldError).
    gc_publish_interval_ms: int = 10_000

    def __post_init__(self) -> None:
        for name in (
            "lease_ms",
            "lock_wait_ms",
            "resolve_wait_ms",
            "settle_attempts",
            "settle_backoff_ms",
            "gateway_settle_attempts",
            "gateway_settle_pause_ms",
            "scan_page_size",
            "status_cache_size",
            "gc_publish_interval_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be int, got {type(value).__name__}")
            positive = ("lease_ms", "scan_page_size", "gc_publish_interval_ms")
            if value < 0 or (value == 0 and name in positive):
                raise ValueError(f"{name} must be positive, got {value}")
