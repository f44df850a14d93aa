"""What every workload provides, on the client side and on the harness side."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from percolake.tools.chaos._config import RunConfig
from percolake.tools.chaos._ops import Completion, Phase
from txn import Isolation, Manager


@dataclass(slots=True)
class ClientContext:
    """What a client process hands its workload: a manager and where it stands."""

    #: ``None`` for the timestamps workload, which runs no transactions.
    manager: Manager | None
    isolation: Isolation
    process: int
    phase: Phase | None
    #: Lakehouse clients: the table handle (``spark_integration.Lakehouse``).
    lakehouse: Any = None
    #: The oracle's address (several: replicas) this client was given.
    tso: str = ""

    @property
    def txns(self) -> Manager:
        """The transaction manager of a workload that runs transactions."""
        if self.manager is None:
            raise RuntimeError("this client runs no transactions (timestamps workload)")
        return self.manager


@dataclass(slots=True)
class CheckResult:
    """One check's verdict: anomalies (empty when clean) and what it looked at."""

    name: str
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "anomalies": len(self.anomalies), **self.stats}


class Workload(ABC):
    """A workload: generates and runs operations in clients, then checks the history."""

    name: str
    #: File name of the merged operation log in the run folder.
    history_name: str

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    # --- client side ---------------------------------------------------------------

    def open_client(self, ctx: ClientContext) -> None:  # noqa: B027 - optional hook
        """Prepare per-process state before the first operation (default: nothing)."""

    def close_client(self, ctx: ClientContext) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`open_client` opened (default: nothing)."""

    @abstractmethod
    def generate(
        self, rng: random.Random, elapsed_s: float, process: int, counter: int
    ) -> tuple[str, Any]:
        """The next operation: its ``f`` and the value its invocation records."""

    @abstractmethod
    def execute(self, ctx: ClientContext, f: str, value: Any) -> Completion:
        """Run one operation and classify its outcome."""

    # --- harness side --------------------------------------------------------------

    def setup(self, manager: Manager, warehouse: str) -> None:  # noqa: B027 - optional hook
        """Create what the clients expect before they start (default: nothing)."""

    @abstractmethod
    def final_read(
        self, manager: Manager, ops: list[dict[str, Any]], warehouse: str
    ) -> list[dict[str, Any]]:
        """After every fault healed: read the whole state; return it as an invoke and
        an ``ok`` completion of process ``FINAL_PROCESS`` (timestamps included)."""

    @abstractmethod
    def check(self, ops: list[dict[str, Any]]) -> list[CheckResult]:
        """Check the merged history (final read included)."""


def make_workload(config: RunConfig) -> Workload:
    if config.workload == "list-append":
        from percolake.tools.chaos._list_append import ListAppend

        return ListAppend(config)
    if config.workload == "bank":
        from percolake.tools.chaos._bank import Bank

        return Bank(config)
    if config.workload == "timestamps":
        from percolake.tools.chaos._timestamps import Timestamps

        return Timestamps(config)
    from percolake.tools.chaos._lakehouse import LakehouseAppends

    return LakehouseAppends(config)
