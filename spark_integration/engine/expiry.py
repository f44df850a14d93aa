"""A table's retention properties and the passes that expire what they no longer keep.

The cells and the steps are in ``retention``; this runs them as transactions of a
catalog, retried at the table's head like commits.
"""

from __future__ import annotations

from spark_integration.engine.retention import (
    STEP_ROWS,
    ExpireResult,
    PublishMemo,
    Retention,
    expire_step,
    publish_expiry,
    read_retention,
    write_retention,
)
from spark_integration.engine.table_access import TableAccess
from txn import Transaction


class Expiry:
    """Retention reads, changes and expiry passes of one catalog's tables."""

    def __init__(self, tables: TableAccess) -> None:
        self._tables = tables

    def retention(self, name: str) -> Retention:
        """The table's retention properties (the defaults unless set)."""
        with self._tables.tm.begin() as tx:
            self._tables.read_head(tx, name)
            return read_retention(tx, self._tables.layout, name)

    def set_retention(self, name: str, retention: Retention) -> None:
        """Change the table's retention properties; the next expiry applies them.

        No version is written (commits do not conflict with it). Lowering a
        retention expires more at the next expiry; raising it brings nothing back.
        """
        if not isinstance(retention, Retention):
            raise TypeError(f"retention must be a Retention, got {type(retention).__name__}")

        def attempt(tx: Transaction) -> None:
            self._tables.read_head(tx, name)
            write_retention(tx, self._tables.layout, name, retention)

        self._tables.transact(attempt, what=f"setting the retention of table {name!r}")

    def expire(self, name: str, now_ms: int, *, max_rows: int | None = None) -> ExpireResult:
        """Expire what the table's retention no longer keeps, as of ``now_ms``.

        First publishes the new bounds (one transaction; it writes the head only when
        versions newly expire), then deletes in transactions of at most
        ``STEP_ROWS`` cells until nothing is left or about ``max_rows`` cells went
        (``None``: no limit; the rest goes next time). See ``retention``. Safe to
        run in several processes at once: every bound only rises, and two passes
        conflict on the table's expiry cell, so one of them retries.
        """
        tables = self._tables
        # Shared by the retries: a publish that lost the head to a commit retries
        # without searching the log again (see PublishMemo).
        memo = PublishMemo()

        def publish(tx: Transaction) -> int:
            head = tables.read_head(tx, name)
            return publish_expiry(tx, tables.layout, name, head, now_ms, memo).readable_from

        # The publish writes the head: it takes its turn there like a commit of this
        # process, so the commits this process makes (a gateway's group commits) wait
        # for its one transaction instead of each making it conflict and retry (issue
        # 27: on one Cassandra node at ~50 appends/s a publish lost the head to them
        # for up to 40 s). Commits of other processes still race it through the
        # transaction protocol, as before.
        with tables.head_turn(name):
            readable, _ = tables.transact(publish, what=f"expiry of table {name!r}")
        total = ExpireResult(readable_from=readable)
        while max_rows is None or total.deleted < max_rows:
            budget = STEP_ROWS if max_rows is None else min(STEP_ROWS, max_rows - total.deleted)
            step, _ = tables.transact(
                lambda tx, b=budget: expire_step(tx, tables.layout, name, b),  # type: ignore[misc]
                what=f"expiry of table {name!r}",
            )
            total.add(step.deleted)
            if not step.more:
                break
        return total
