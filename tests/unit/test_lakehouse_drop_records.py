"""A dropped table's files go with vacuum: the catalog side, without Spark (issue 26).

A drop deletes the table's metadata and records its location (``lifecycle``); a
vacuum of the name claims the record once its retention has passed; a table created
at the location deletes the record and is fenced at the drop time. The claim and the
create write the same cell, so one of two concurrent ones loses. The catalog is the
embedded one on an in-memory store with an injected clock; files are metadata only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spark_integration.engine import (
    Catalog,
    ConcurrentModificationError,
    TableExistsError,
    TableNotFoundError,
    lifecycle,
)
from spark_integration.engine.model import APPEND, FileEntry, Layout, TableMeta
from txn import TransactionConfig, TransactionManager
from wire.errors import TransactionConflictError

pytestmark = pytest.mark.unit

LOCATION = "/warehouse/events"


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tm() -> Iterator[TransactionManager]:
    tm = TransactionManager.embedded("memory://", config=TransactionConfig(settle_backoff_ms=1))
    yield tm
    tm.close()


@pytest.fixture
def catalog(tm: TransactionManager, clock: Clock) -> Catalog:
    return Catalog(tm, "lakehouse", clock_ms=clock)


def create(catalog: Catalog, name: str = "events", *, over_dropped: bool = False) -> None:
    meta = TableMeta(name, "{}", (), LOCATION, 0)
    catalog.create(meta, job_id=f"create-{name}", over_dropped=over_dropped)


def append(catalog: Catalog, path: str, started_ms: int, name: str = "events") -> int:
    entry = FileEntry(path, 1, 1, {}, None)
    return catalog.commit_files(
        name, APPEND, [entry], job_id=f"job-{path}", job_started_ms=started_ms
    ).version


def records(tm: TransactionManager) -> list[lifecycle.DroppedTable]:
    with tm.begin() as tx:
        return lifecycle.dropped_tables(tx, Layout("lakehouse"))


def test_a_drop_records_the_location_and_its_time(
    tm: TransactionManager, catalog: Catalog, clock: Clock
) -> None:
    create(catalog)
    append(catalog, "a.parquet", clock.ms)
    clock.ms += 5_000
    assert catalog.drop_table("events").location == LOCATION
    assert records(tm) == [lifecycle.DroppedTable("events", LOCATION, clock.ms)]
    assert catalog.list_tables() == []


def test_a_claim_takes_only_records_whose_retention_has_passed(
    tm: TransactionManager, catalog: Catalog, clock: Clock
) -> None:
    create(catalog)
    catalog.drop_table("events")
    dropped = lifecycle.DroppedTable("events", LOCATION, clock.ms)
    # Dropped after the cutoff: nothing claimed, the record stays.
    assert catalog.claim_dropped("events", clock.ms - 1) == ([], [dropped])
    assert records(tm) == [dropped]
    assert catalog.claim_dropped("events", clock.ms) == ([dropped], [])
    assert records(tm) == []
    with pytest.raises(TableNotFoundError, match="no dropped table of that name"):
        catalog.claim_dropped("events", clock.ms)
    with pytest.raises(TableNotFoundError, match="'other'"):
        catalog.claim_dropped("other", clock.ms)


def test_a_claim_refuses_a_live_table_of_that_name(catalog: Catalog, clock: Clock) -> None:
    create(catalog)
    with pytest.raises(TableExistsError, match="'events' exists"):
        catalog.claim_dropped("events", clock.ms)


def test_a_create_over_a_record_deletes_it_and_is_fenced_at_the_drop_time(
    tm: TransactionManager, catalog: Catalog, clock: Clock
) -> None:
    create(catalog)
    append(catalog, "old.parquet", clock.ms)
    clock.ms += 1_000
    dropped_ms = clock.ms
    catalog.drop_table("events")
    clock.ms += 1_000
    create(catalog, over_dropped=True)
    assert records(tm) == []
    assert catalog.prepare("events").head.vacuum_cutoff_ms == dropped_ms
    # A job that started before the drop may have been swept: it cannot commit.
    with pytest.raises(ConcurrentModificationError, match="cutoff"):
        append(catalog, "stale.parquet", dropped_ms - 1)
    assert append(catalog, "new.parquet", dropped_ms) == 1
    # The record is gone: a vacuum of the name now vacuums the new table.
    with pytest.raises(TableExistsError):
        catalog.claim_dropped("events", clock.ms)


def test_a_create_over_files_without_a_record_is_refused(
    tm: TransactionManager, catalog: Catalog
) -> None:
    with pytest.raises(TableExistsError, match="already holds files"):
        create(catalog, over_dropped=True)
    assert catalog.list_tables() == []
    create(catalog)  # an empty location needs no record
    assert catalog.prepare("events").head.vacuum_cutoff_ms == 0


def test_a_claim_and_a_create_of_one_location_conflict(
    tm: TransactionManager, catalog: Catalog, clock: Clock
) -> None:
    create(catalog)
    catalog.drop_table("events")
    layout = Layout("lakehouse")
    meta = TableMeta("events", "{}", (), LOCATION, 0)
    for claim_first in (True, False):
        claim, new = tm.begin(), tm.begin()
        claimed, _ = lifecycle.claim_dropped(claim, layout, "events", clock.ms)
        assert [d.location for d in claimed] == [LOCATION]
        assert lifecycle.replace_dropped(new, layout, meta, over_dropped=True) == clock.ms
        first, second = (claim, new) if claim_first else (new, claim)
        first.commit()
        with pytest.raises(TransactionConflictError):
            second.commit()
        # Put the record back for the other order.
        if not claim_first:
            break
        with tm.begin() as tx:
            tx.put(
                layout.dropped,
                Layout.dropped_row(LOCATION),
                Layout.COL_DROPPED,
                lifecycle.DroppedTable("events", LOCATION, clock.ms).encode(),
            )
    assert records(tm) == []
