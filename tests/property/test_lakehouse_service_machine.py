"""Lakehouse commits through a gateway's ``LakehouseService``, with faults at the gateway.

Hypothesis interleaves appends (alone, or several at once from different clients so
that they meet in a group), replays of committed ``(app_id, batch_id)``s, vacuums and
commits their fence refuses, with faults injected inside a real gateway process of
the test build (its group committer obeys a control file, see
:mod:`percolake.tools.chaos.failpoints_serve`):

* the next group's replies are lost after its commit point, or before its
  transaction began (every member is answered ``commit-unknown``; the clients send
  the same job again);
* the gateway is killed (SIGKILL, by pid) with the next group blocked after its
  commit point or before its transaction, and restarted on the same store and port;
* the gateway stays down longer than a client's commit deadline: the client gets
  ``CommitUnknownError``, and sending the same job id again once the gateway is back
  settles it (the version committed before the kill, or one committed now).

Between them go garbage collection passes at retention 0 beside the gateway (as
``percolake gc`` runs), so the restarts above leave a gateway that never saw the
collected entries, and ``version_at`` questions through the gateway (issue 30).

After every step the table matches the model: versions dense, each version lists
exactly the files the model expects, each call that returned a version made exactly
that version, replays returned their first version and added nothing, and no file
of a definitely refused commit is named by any version. Every version's commit
timestamp in history stays what it first was (GC and restarts notwithstanding), log
times never decrease, and a ``version_at`` answer never changes.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("pyspark")

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pyspark.sql.types import LongType, StructField, StructType

from percolake.tools.chaos.failpoints_serve import (
    fired_path,
    read_lakehouse_control,
    write_lakehouse_control,
)
from spark_integration import (
    ConcurrentModificationError,
    DataFile,
    Lakehouse,
    VersionNotFoundError,
)
from spark_integration.engine.model import APPEND, FileEntry
from spark_integration.service.client import RemoteCatalog
from spark_integration.spark.hook import STAGING_PREFIX
from storage_adapters import open_store
from tests.servers import steered_server
from tso.timestamp_service import RemoteTimestampSource
from txn import GarbageCollector, TransactionManager
from txn.errors import CommitUnknownError
from txn.remote import RemoteTransactionManager
from txn.tables import GC_TABLE, STATE_KEY, GcState

pytestmark = [pytest.mark.property, pytest.mark.integration]

CATALOG = "lakehouse"
SCHEMA = StructType([StructField("id", LongType())])
CLIENTS = 3
#: Commits resend a lost reply this long; the gateway restarts well within it.
COMMIT_TIMEOUT_S = 60.0
#: A client that gives up before the gateway is back (``gateway_down_too_long``).
IMPATIENT_TIMEOUT_S = 1.5
FIRED_WAIT_S = 30.0
MAX_RESTARTS_PER_EXAMPLE = 2
#: The store's grace: what a pass beside the gateway waits before deleting.
GRACE_MS = 100
_ids = itertools.count()


class Gateway:
    """The test-build gateway the machine steers, restarted by pid on its port."""

    def __init__(self, workdir: Path) -> None:
        self.control = workdir / "control.json"
        write_lakehouse_control(str(self.control), {})
        self.store_url = f"sqlite:///{workdir}/store.db"
        store = open_store(self.store_url)  # a short grace before the gateway leases it
        store.put_unless_exists(GC_TABLE, STATE_KEY, GcState(grace_ms=GRACE_MS).encode())
        store.close()
        self.server = steered_server(
            "all", ["--store", self.store_url], workdir, self.control
        ).start()

    @property
    def address(self) -> str:
        return self.server.address

    def add_rule(self, at: str, action: str) -> str:
        rule_id = f"r{next(_ids)}"
        rules = [*read_lakehouse_control(str(self.control)).get("rules", [])]
        rules.append({"id": rule_id, "at": at, "action": action})
        write_lakehouse_control(str(self.control), {"rules": rules})
        return rule_id

    def clear_rules(self) -> None:
        write_lakehouse_control(str(self.control), {})

    def fired(self, rule_id: str, wait_s: float = 0.0) -> dict[str, Any] | None:
        path = Path(fired_path(str(self.control), rule_id))
        deadline = time.monotonic() + wait_s
        while not path.exists():
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
        fired: dict[str, Any] = json.loads(path.read_text())
        return fired

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        self.server.start(port=self.server.port)


def file_in(lh: Lakehouse, table: str) -> DataFile:
    n = next(_ids)
    path = f"{lh.warehouse}/{table}/{STAGING_PREFIX}m{n}/part-{n}.parquet"
    return DataFile(path, size_bytes=n, record_count=1)


class ServiceMachine(RuleBasedStateMachine):
    gateway: ClassVar[Gateway]
    houses: ClassVar[list[Lakehouse]]
    managers: ClassVar[list[RemoteTransactionManager]]
    warehouse: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.table = f"t{uuid.uuid4().hex[:12]}"
        #: versions[v]: the files of version v; versions[0] is the empty table.
        self.versions: list[frozenset[str]] = []
        self.batches: dict[tuple[str, int], int] = {}
        self.refused: set[str] = set()
        self.fenced = False
        self.restarts = 0
        #: T -> the version ``version_at(T)`` answered (-1: the table was younger).
        self.answers: dict[int, int] = {}
        #: version -> its commit timestamp, as history first showed it.
        self.commit_tss: dict[int, int] = {}

    @initialize()
    def create(self) -> None:
        self.gateway.clear_rules()
        self.houses[0].create_table(self.table, SCHEMA)
        self.versions.append(frozenset())

    # --- helpers ----------------------------------------------------------------------

    def _committed(self, version: int, path: str) -> None:
        assert version == len(self.versions), (
            f"told version {version}, the next version is {len(self.versions)}"
        )
        self.versions.append(self.versions[-1] | {path})

    def _append(self, client: int, batch: tuple[str, int] | None = None) -> None:
        lh = self.houses[client]
        data = file_in(lh, self.table)
        kwargs: dict[str, Any] = {}
        if batch is not None:
            kwargs = {"app_id": batch[0], "batch_id": batch[1]}
        version = lh.append_files(self.table, [data], **kwargs)
        if batch is not None and batch in self.batches:
            assert version == self.batches[batch], "a replay got another version"
            self.refused.add(data.path)  # a replay adds nothing
            return
        self._committed(version, data.path)
        if batch is not None:
            self.batches[batch] = version

    # --- rules ------------------------------------------------------------------------

    @rule(client=st.integers(0, CLIENTS - 1), batched=st.booleans())
    def append(self, client: int, batched: bool) -> None:
        self._append(client, ("app", len(self.batches)) if batched else None)

    @precondition(lambda self: bool(self.batches))
    @rule(client=st.integers(0, CLIENTS - 1), data=st.data())
    def replay(self, client: int, data: st.DataObject) -> None:
        batch = data.draw(st.sampled_from(sorted(self.batches)))
        self._append(client, batch)

    @rule(n=st.integers(2, CLIENTS))
    def appends_at_once(self, n: int) -> None:
        """Appends from ``n`` clients at once: they meet in a group or race at the head."""
        told: dict[str, int] = {}
        errors: list[BaseException] = []

        def one(client: int) -> None:
            lh = self.houses[client]
            data = file_in(lh, self.table)
            try:
                told[data.path] = lh.append_files(self.table, [data])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(c,)) for c in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(COMMIT_TIMEOUT_S + 10)
        assert not errors, errors
        for path, version in sorted(told.items(), key=lambda item: item[1]):
            self._committed(version, path)

    @rule(at=st.sampled_from(["before", "after"]), client=st.integers(0, CLIENTS - 1))
    def reply_lost(self, at: str, client: int) -> None:
        """The next group's replies are lost (commit-unknown), before or after it commits."""
        rule_id = self.gateway.add_rule(at, "unknown")
        try:
            self._append(client)
        finally:
            self.gateway.clear_rules()
        assert self.gateway.fired(rule_id) is not None, "the fault never happened"

    @precondition(lambda self: self.restarts < MAX_RESTARTS_PER_EXAMPLE)
    @rule(at=st.sampled_from(["before", "after"]), client=st.integers(0, CLIENTS - 1))
    def gateway_killed_mid_group(self, at: str, client: int) -> None:
        """The gateway dies with the next group blocked ``at`` its commit; it restarts."""
        rule_id = self.gateway.add_rule(at, "block")
        result: list[Any] = []
        lh = self.houses[client]
        data = file_in(lh, self.table)

        def commit() -> None:
            try:
                result.append(lh.append_files(self.table, [data]))
            except BaseException as exc:
                result.append(exc)

        committer = threading.Thread(target=commit)
        committer.start()
        fired = self.gateway.fired(rule_id, FIRED_WAIT_S)
        assert fired is not None, "the group never reached the fail point"
        self.gateway.kill()
        self.gateway.clear_rules()
        self.gateway.restart()
        self.restarts += 1
        committer.join(COMMIT_TIMEOUT_S + 10)
        assert len(result) == 1 and isinstance(result[0], int), result
        self._committed(result[0], data.path)

    @precondition(lambda self: self.restarts < MAX_RESTARTS_PER_EXAMPLE)
    @rule(at=st.sampled_from(["before", "after"]))
    def gateway_down_too_long(self, at: str) -> None:
        """A client gives up while the gateway is down (commit unknown); once the gateway
        is back, sending the same job id again settles the outcome."""
        rule_id = self.gateway.add_rule(at, "block")
        impatient = RemoteCatalog(self.managers[0], CATALOG, commit_timeout_s=IMPATIENT_TIMEOUT_S)
        job_id = f"job-{uuid.uuid4().hex[:12]}"
        data = file_in(self.houses[0], self.table)
        entry = data.path.removeprefix(f"{self.warehouse}/{self.table}/")
        outcome: list[BaseException | None] = []

        def commit() -> None:
            try:
                impatient.commit_files(
                    self.table, APPEND, [_entry(entry)], job_id=job_id, job_started_ms=_now_ms()
                )
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        committer = threading.Thread(target=commit)
        committer.start()
        assert self.gateway.fired(rule_id, FIRED_WAIT_S) is not None
        self.gateway.kill()
        committer.join(IMPATIENT_TIMEOUT_S + 30)
        assert len(outcome) == 1 and isinstance(outcome[0], CommitUnknownError), outcome
        self.gateway.clear_rules()
        self.gateway.restart()
        self.restarts += 1
        patient = RemoteCatalog(self.managers[1], CATALOG, commit_timeout_s=COMMIT_TIMEOUT_S)
        settled = patient.commit_files(
            self.table, APPEND, [_entry(entry)], job_id=job_id, job_started_ms=_now_ms()
        )
        assert not settled.replayed
        self._committed(settled.version, data.path)

    @precondition(lambda self: not self.fenced)
    @rule()
    def vacuum(self) -> None:
        """Publish a vacuum cutoff of now: files written before it may be gone."""
        assert self.houses[0].vacuum(self.table, retain_seconds=0) == []
        self.fenced = True

    @precondition(lambda self: self.fenced)
    @rule(client=st.integers(0, CLIENTS - 1))
    def fenced_commit(self, client: int) -> None:
        """Files written before the vacuum's cutoff: definitely refused."""
        lh = self.houses[client]
        data = file_in(lh, self.table)
        with pytest.raises(ConcurrentModificationError):
            lh.append_files(self.table, [data], written_since_ms=1)
        self.refused.add(data.path)

    @rule()
    def collect_garbage(self) -> None:
        """A pass at retention 0 beside the gateway: entries below it are stamped and go."""
        store = open_store(self.gateway.store_url)
        try:
            GarbageCollector(
                store,
                timestamps=RemoteTimestampSource(self.managers[0].connection),
                retention_s=0,
                grace_ms=GRACE_MS,
            ).run_once()
        finally:
            store.close()

    @rule(client=st.integers(0, CLIENTS - 1), again=st.booleans(), pick=st.integers(0, 63))
    def travel(self, client: int, again: bool, pick: int) -> None:
        """``version_at`` now, or at a time asked before: the first answer, always."""
        asked = sorted(self.answers)
        at = asked[pick % len(asked)] if again and asked else _now_ms()
        try:
            got = self.houses[client].version_at(self.table, at)
        except VersionNotFoundError as exc:
            if "created after" not in str(exc):
                # Vacuum took the version as of then: no answer, never another one.
                assert self.answers.get(at, -1) < len(self.versions) - 1, exc
                return
            got = -1
        first = self.answers.setdefault(at, got)
        assert got == first, f"version_at({at}) answered {first}, now {got}"

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def table_matches_the_model(self) -> None:
        if not self.versions:
            return
        lh = self.houses[CLIENTS - 1]
        history = lh.history(self.table)
        assert [c.version for c in history] == list(range(len(self.versions)))
        named: set[str] = set()
        for c in history:
            named.update(c.added_files)
        assert not named & self.refused, "a refused or replayed commit's file is in a version"
        for batch, version in self.batches.items():
            assert (history[version].app_id, history[version].batch_id) == batch
        for version, files in enumerate(self.versions):
            assert {f.path for f in lh.files(self.table, version)} == files
        times = [c.timestamp_ms for c in history]
        assert times == sorted(times), f"log times go backwards: {times}"
        for at, answer in self.answers.items():
            newest = max((c.version for c in history if c.timestamp_ms <= at), default=-1)
            assert newest == answer, f"version_at({at}) answered {answer}, the log says {newest}"
        for c in history:
            assert c.commit_ts is not None, f"version {c.version} has no commit timestamp"
            first = self.commit_tss.setdefault(c.version, c.commit_ts)
            assert c.commit_ts == first, f"version {c.version}'s commit timestamp changed"


def _entry(path: str) -> FileEntry:
    return FileEntry(path, 1, 1, {})


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


SETTINGS = settings(
    max_examples=8,
    stateful_step_count=10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("lakehouse-service-machine"))
    try:
        yield gw
    finally:
        gw.server.stop()


def test_lakehouse_service_under_gateway_faults(gateway: Gateway, tmp_path: Path) -> None:
    managers = [TransactionManager.remote(gateway.address, timeout_s=30) for _ in range(CLIENTS)]
    assert all(isinstance(m, RemoteTransactionManager) for m in managers)
    warehouse = str(tmp_path / "warehouse")

    class Machine(ServiceMachine):
        pass

    Machine.gateway = gateway
    Machine.managers = managers
    Machine.houses = [Lakehouse(m, warehouse, commit_timeout_s=COMMIT_TIMEOUT_S) for m in managers]
    Machine.warehouse = warehouse
    try:
        run_state_machine_as_test(Machine, settings=SETTINGS)
    finally:
        for m in managers:
            m.close()
