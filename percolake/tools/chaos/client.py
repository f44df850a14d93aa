"""``python -m percolake.tools.chaos.client``: one client process of a chaos run.

It runs the workload's operations one after another until its deadline and records
each as an invocation and a completion, one JSON line each, written before the next
step: a SIGKILL loses at most the completion of the operation in flight, which the
harness then records as ``info`` (unknown outcome).

``--mode remote`` talks to gateways (``TransactionManager.remote``), moving to the
next gateway when one is unavailable; ``--mode replicas`` talks to the gateways of the
replicas of a replicated control plane (``--tso``, every replica's address: the client
fails over between them by itself); ``--mode direct`` runs the commit protocol in
this process against the remote oracle and lock server and the shared store, the way
an in-process Spark driver does, so that a pause or a kill of this process strands
its own locks and versions. ``--mode timestamps`` runs no transactions: the
timestamps workload asks the oracle at ``--tso`` (one replica, or all of them).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar

from percolake.tools.chaos._config import RunConfig
from percolake.tools.chaos._late import LateSettler
from percolake.tools.chaos._ops import Completion, Phase
from percolake.tools.chaos._workload import ClientContext, make_workload
from percolake.tools.chaos.unsafe import unsafe_build_from_env
from txn import (
    COMMIT_STEPS,
    Isolation,
    Manager,
    RetryPolicy,
    Transaction,
    TransactionConfig,
    TransactionManager,
    TransactionStatus,
    run_transaction,
)
from wire.error_codes import ServiceUnavailableError

if TYPE_CHECKING:
    from txn.remote import RemoteTransactionManager

log = logging.getLogger("percolake.tools.chaos.client")

T = TypeVar("T")

#: Pause after an operation that did not commit, so a dead server is not hammered.
BACKOFF_S = (0.005, 0.05)
#: How long a client waits for the run's clock (every other client starting).
START_TIMEOUT_S = 300.0


class FailoverManager:
    """Remote managers on every gateway; moves on to the next one when one is down."""

    def __init__(self, addresses: Sequence[str], first: int, timeout_s: float) -> None:
        from txn.remote import RemoteTransactionManager

        self._managers = [RemoteTransactionManager(a, timeout_s=timeout_s) for a in addresses]
        self._current = first % len(self._managers)

    @property
    def remote_managers(self) -> list[RemoteTransactionManager]:
        """The manager of every gateway, the one this client uses now first."""
        return self._managers[self._current :] + self._managers[: self._current]

    def begin(
        self, isolation: Isolation = Isolation.SNAPSHOT, *, pessimistic: bool = False
    ) -> Transaction:
        manager = self._managers[self._current]
        try:
            return manager.begin(isolation, pessimistic=pessimistic)
        except ServiceUnavailableError:
            self._current = (self._current + 1) % len(self._managers)
            raise

    def run(
        self,
        fn: Callable[[Transaction], T],
        isolation: Isolation = Isolation.SNAPSHOT,
        max_attempts: int = 10,
        *,
        pessimistic: bool = False,
    ) -> T:
        policy = RetryPolicy(max_attempts=max_attempts)

        def begin(isolation: Isolation) -> Transaction:
            return self.begin(isolation, pessimistic=pessimistic)

        return run_transaction(begin, self.outcome, fn, policy, isolation=isolation)[0]

    def attach(self, txn_id: str) -> Transaction:
        return self._managers[self._current].attach(txn_id)

    def outcome(self, txn_id: str, *, settle: bool = False) -> TransactionStatus | None:
        # Any gateway answers from the transactions table (and fences what it holds).
        return self._managers[self._current].outcome(txn_id, settle=settle)

    def close(self) -> None:
        for manager in self._managers:
            manager.close()

    def __enter__(self) -> FailoverManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def direct_manager(
    store_url: str,
    tso: str,
    locks: str,
    config: RunConfig,
    timeout_s: float,
    *,
    commit_steps: tuple[str, ...] = COMMIT_STEPS,
) -> TransactionManager:
    """A manager running the protocol in this process, with the run's short timeouts.

    ``commit_steps`` other than ``COMMIT_STEPS``: the broken test build (see ``unsafe``).
    """
    from lockserver.lock_service import RemoteLockService
    from storage_adapters import open_store
    from tso.timestamp_service import RemoteTimestampSource
    from wire.channels import Connection

    store = open_store(store_url)
    tso_conn, locks_conn = Connection(tso), Connection(locks)
    return TransactionManager(
        store,
        RemoteTimestampSource(tso_conn, timeout_s=timeout_s),
        RemoteLockService(locks_conn, timeout_s=timeout_s),
        TransactionConfig(
            lease_ms=config.lease_ms,
            lock_wait_ms=config.lock_wait_ms,
            resolve_wait_ms=config.resolve_wait_ms,
        ),
        owns=(store, tso_conn, locks_conn),
        commit_steps=commit_steps,
    )


class EventWriter:
    """JSON lines, each written out before the next step of the operation."""

    def __init__(self, path: Path, process: int, t0_ns: int) -> None:
        self._out: IO[str] = path.open("a", buffering=1, encoding="utf-8")
        self._process = process
        self._t0_ns = t0_ns

    def write(self, event: dict[str, Any]) -> None:
        event = {**event, "process": self._process, "time": time.monotonic_ns() - self._t0_ns}
        self._out.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._out.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m percolake.tools.chaos.client")
    parser.add_argument("--run-config", required=True, type=Path)
    parser.add_argument("--process", required=True, type=int)
    parser.add_argument(
        "--mode", required=True, choices=["remote", "replicas", "direct", "timestamps"]
    )
    parser.add_argument("--gateways", default="")
    parser.add_argument("--tso", default="")
    parser.add_argument("--locks", default="")
    parser.add_argument("--store", default="")
    parser.add_argument("--warehouse", default="")
    parser.add_argument(
        "--start-file",
        type=Path,
        help="wait until this file holds 'T0_NS UNTIL_NS' (the run's clock), then start",
    )
    parser.add_argument("--t0-ns", type=int, help="the run's clock, without --start-file")
    parser.add_argument("--until-ns", type=int)
    parser.add_argument("--events", required=True, type=Path)
    parser.add_argument("--phase", required=True, type=Path)
    return parser


def run_client(args: argparse.Namespace) -> int:
    config = RunConfig.load(args.run_config)
    build = unsafe_build_from_env()
    workload = make_workload(config)
    isolation = Isolation.SERIALIZABLE if config.isolation == "serializable" else Isolation.SNAPSHOT
    manager: Manager | None = None
    if args.mode == "remote":
        gateways = [a for a in args.gateways.split(",") if a]
        manager = FailoverManager(gateways, args.process, config.client_timeout_s)
    elif args.mode == "replicas":
        # One manager on every replica: its channel moves between them by itself.
        manager = FailoverManager([args.tso], 0, config.client_timeout_s)
    elif args.mode == "direct":
        manager = direct_manager(
            args.store,
            args.tso,
            args.locks,
            config,
            timeout_s=config.client_timeout_s,
            commit_steps=build.commit_steps,
        )
    phase = Phase(args.phase)
    ctx = ClientContext(
        manager=manager, isolation=isolation, process=args.process, phase=phase, tso=args.tso
    )
    if config.workload == "lakehouse":
        from percolake.tools.chaos._lakehouse import LakehouseAppends

        ctx.lakehouse = LakehouseAppends.open_lakehouse(
            ctx.txns,
            args.warehouse,
            timeout_s=3 * config.client_timeout_s,
            slot=args.process % config.clients,
        )
    workload.open_client(ctx)
    rng = random.Random(f"{config.seed}-client-{args.process}")
    if args.start_file is not None:
        phase.set(Phase.READY)
        t0_ns, until_ns = _wait_for_start(args.start_file)
        phase.set(Phase.IDLE)
    elif args.t0_ns is not None and args.until_ns is not None:
        t0_ns, until_ns = args.t0_ns, args.until_ns
    else:
        raise SystemExit("give --start-file, or --t0-ns and --until-ns")
    events = EventWriter(args.events, args.process, t0_ns)
    late: LateSettler | None = None
    if config.late_settle_s is not None and isinstance(manager, FailoverManager):
        settle_from = manager
        late = LateSettler(
            lambda: settle_from.remote_managers,
            config.late_settle_s,
            random.Random(f"{config.seed}-late-{args.process}"),
            args.events,
        )
    done = 0
    # Start together with the other clients: the fault schedule counts from t0.
    time.sleep(max(0.0, (t0_ns - time.monotonic_ns()) / 1e9))
    try:
        counter = 0
        while time.monotonic_ns() < until_ns or (
            args.start_file is not None
            and time.monotonic_ns() < (until_ns := _wait_for_start(args.start_file)[1])
        ):
            counter += 1
            elapsed_s = (time.monotonic_ns() - t0_ns) / 1e9
            f, value = workload.generate(rng, elapsed_s, args.process, counter)
            events.write({"type": "invoke", "f": f, "value": value})
            try:
                completion = workload.execute(ctx, f, value)
            except Exception as exc:  # a workload bug must not look like a clean run
                log.exception("operation %s %r raised", f, value)
                completion = Completion("info", value, error=f"client error: {exc!r}")
            if late is not None:  # list-append: appends are what a transaction writes
                wrote = any(m[0] == "append" for m in value)
                completion = late.after(completion, wrote=wrote)
            events.write(_completion_event(f, completion))
            if late is not None:
                late.run_due()
            done += 1
            if completion.type != "ok":
                time.sleep(rng.uniform(*BACKOFF_S))
            if config.rate is not None:  # Jepsen's stagger: a mean gap of clients / rate
                time.sleep(rng.uniform(0.0, 2.0 * config.clients / config.rate))
    finally:
        events.close()
        if late is not None:
            late.close()
        phase.close()
        workload.close_client(ctx)
        if manager is not None:
            manager.close()
    log.info("client %d done: %d operations", args.process, done)
    return 0


def _wait_for_start(path: Path, timeout_s: float = START_TIMEOUT_S) -> tuple[int, int]:
    """The run's clock from the harness's start file, once it is written."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            t0, until = (int(part) for part in path.read_text().split())
            return t0, until
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise SystemExit(f"no start file {path} after {timeout_s:.0f} s") from None
            time.sleep(0.005)


def _completion_event(f: str, c: Completion) -> dict[str, Any]:
    event: dict[str, Any] = {"type": c.type, "f": f, "value": c.value}
    if c.start_ts is not None:
        event["start_ts"] = c.start_ts
    if c.commit_ts is not None:
        event["commit_ts"] = c.commit_ts
    if c.error is not None:
        event["error"] = c.error
    if c.node is not None:
        event["node"] = c.node
    return event


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("percolake.tools.chaos.client").setLevel(logging.INFO)
    logging.getLogger("cassandra").setLevel(logging.WARNING)
    return run_client(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
