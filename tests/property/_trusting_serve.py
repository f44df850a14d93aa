"""A committer that trusts the locks of ``get_for_update``: BROKEN ON PURPOSE (issue 28).

Its conflict check skips every cell the transaction locked with ``get_for_update``, as if
the lock alone kept other writers away. That is right while every lock holds; locks are
liveness only (S5), so once one is lost (a lease that expired, a lock-server restart or
failover) another writer commits the cell between the locked read and the commit, and
one of the two updates is lost. The state machines must catch it.

:func:`lock_trusting` wraps the correct check of one table
(``txn._committer._check_table_conflicts``), the test-only seam: the protocol state
machine's test patches it in-process; ``python -m tests.property._trusting_serve`` is the
gateway's test build (``python -m percolake.tools.chaos.serve``, same arguments) with
the patch installed, for the remote state machine. Nothing in product code changes.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping

from percolake.tools.chaos import serve
from storage_adapters import Cell
from txn import _committer
from txn._runtime import Runtime

log = logging.getLogger(__name__)

#: The signature of ``txn._committer._check_table_conflicts``.
TableCheck = Callable[[Runtime, str, list[Cell], int, Mapping[Cell, int] | None], None]


def lock_trusting(check: TableCheck) -> TableCheck:
    """``check`` for the cells that were not locked by ``get_for_update`` (those without
    a read bound); the locked ones are not checked at all."""

    def trusting(
        rt: Runtime,
        table: str,
        keys: list[Cell],
        start_ts: int,
        read_bounds: Mapping[Cell, int] | None = None,
        *,
        first_page: Mapping[Cell, list[int]] | None = None,
    ) -> None:
        locked = set(read_bounds or {})
        unlocked = [cell for cell in keys if cell not in locked]
        if unlocked:
            check(rt, table, unlocked, start_ts, None)  # reads its own first page

    return trusting


def main() -> int:
    """Run the gateway's test build with commits that trust get_for_update locks."""
    setattr(  # noqa: B010 (a module attribute, replaced for this process only)
        _committer,
        "_check_table_conflicts",
        lock_trusting(_committer._check_table_conflicts),
    )
    log.critical("BROKEN BUILD: commits skip the conflict check of get_for_update's cells")
    return serve.main()


if __name__ == "__main__":
    sys.exit(main())
