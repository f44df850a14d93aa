"""Overwrite by predicate: ``replaceWhere`` and dynamic partition overwrite.

Both replace part of a table and keep the rest, as one ``REPLACE WHERE`` commit that
carries a read set like a ``DELETE``'s (``dml``):

* ``replace_where="day = 'd1'"``: the DataFrame's rows must all satisfy the predicate
  (checked by one Spark job before anything is written; a row outside it is refused,
  as Delta refuses it). The rows of the table that satisfy it go: files whose every
  row does are dropped, files with some matching rows are rewritten with the others.
  Read set: the files dropped or rewritten, and the predicate's conditions.
* ``dynamic_partitions=True``: the DataFrame's rows are written first; the partitions
  they fall in are replaced, every other partition is untouched. Read set: the files
  of those partitions, and ``IN`` conditions over their values
  (:func:`partitions_read_set`, which the data source shares).

So a concurrent append to another partition never conflicts with either, and one to
a replaced partition (rows this overwrite would have replaced) always does.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from spark_integration.engine.model import REPLACE_WHERE, FileEntry
from spark_integration.engine.read_set import IN, Condition, ReadSet
from spark_integration.spark import dml
from spark_integration.spark.reads import read_version
from spark_integration.spark.schema import check_dataframe_schema, quote

if TYPE_CHECKING:
    from spark_integration.engine.catalog import Catalog
    from spark_integration.service.client import RemoteCatalog

log = logging.getLogger(__name__)

#: The Spark setting that asks an overwrite to replace only the partitions written.
PARTITION_OVERWRITE_CONF = "spark.sql.sources.partitionOverwriteMode"


def mode_of(df: DataFrame, replace_where: object, dynamic_partitions: object) -> str:
    """What an overwrite replaces: ``static`` (the table), ``dynamic`` (the partitions
    written) or ``where`` (the rows ``replace_where`` matches).

    ``dynamic_partitions=None`` follows the DataFrame's session setting
    ``spark.sql.sources.partitionOverwriteMode``, as Spark's own writers do: an
    overwrite asked to be dynamic never replaces the whole table.
    """
    if dynamic_partitions is not None and not isinstance(dynamic_partitions, bool):
        raise TypeError(
            f"dynamic_partitions must be a bool or None, got {type(dynamic_partitions).__name__}"
        )
    if replace_where is not None:
        if not isinstance(replace_where, str):
            raise TypeError(
                f"replace_where must be a SQL string, got {type(replace_where).__name__}"
            )
        if dynamic_partitions:
            raise ValueError("pass replace_where or dynamic_partitions=True, not both")
        return "where"
    if dynamic_partitions is None:
        setting = df.sparkSession.conf.get(PARTITION_OVERWRITE_CONF, "static") or "static"
        return "dynamic" if setting.strip().lower() == "dynamic" else "static"
    return "dynamic" if dynamic_partitions else "static"


def check_no_batch(app_id: object, batch_id: object) -> None:
    if app_id is not None or batch_id is not None:
        raise ValueError(
            "app_id/batch_id make appends and whole-table overwrites idempotent; an "
            "overwrite by predicate or of dynamic partitions does not take them yet"
        )


def overwrite(
    catalog: Catalog | RemoteCatalog,
    name: str,
    df: DataFrame,
    replace_where: str | None,
) -> int:
    """Replace the rows matching ``replace_where``, or (``None``) the partitions the
    DataFrame's rows fall in; returns the version committed (see the module docstring)."""
    session = df.sparkSession
    prepared = catalog.prepare(name)
    meta, version = prepared.meta, prepared.head.version
    schema = StructType.fromJson(json.loads(meta.schema_json))
    check_dataframe_schema(name, schema, df.schema)
    rows = df.selectExpr(
        *[
            f"CAST({quote(f.name)} AS {f.dataType.simpleString()}) AS {quote(f.name)}"
            for f in schema
        ]
    )
    _, _, entries = catalog.files(name, version, FileEntry)
    if replace_where is None and meta.partition_by:
        partition_by = meta.partition_by

        def partitions_written(written: list[FileEntry]) -> ReadSet:
            return partitions_read_set(version, entries, written, schema, partition_by)

        return dml.commit_rewrite(catalog, REPLACE_WHERE, meta, schema, rows, partitions_written)[0]
    what = f"overwrite of table {name!r} where {replace_where!r}"
    predicate = dml.check_predicate(session, schema, replace_where, what)
    if predicate is not None:
        outside = rows.filter(f"NOT {dml.matching(predicate)}").limit(1).collect()
        if outside:
            raise ValueError(
                f"{what}: the DataFrame holds rows that do not satisfy the predicate, "
                f"such as {outside[0].asDict()}; nothing was written (as Delta, an "
                "overwrite by predicate only writes rows it would replace)"
            )
    conditions, exact = dml.conditions_of(predicate, schema, meta.partition_by)
    probe = ReadSet(version, (), conditions)
    candidates = [e for e in entries if probe.may_match(e)]
    if predicate is None or exact:
        counts = {e.path: (e.record_count, e.record_count) for e in candidates}
    else:
        counts = dml.count_matches(session, schema, meta, candidates, predicate)
    touched = [e for e in candidates if counts.get(e.path, (0, 0))[1] > 0]
    partial = [e for e in touched if counts[e.path][1] < counts[e.path][0]]
    if partial:
        kept = read_version(session, schema, meta.partition_by, meta.location, partial)
        rows = rows.unionByName(kept.filter(f"NOT {dml.matching(predicate)}"))
    log.info("%s: replaces %d files (%d rewritten)", what, len(touched), len(partial))
    read_set = ReadSet(version, tuple(e.path for e in touched), conditions)
    return dml.commit_rewrite(catalog, REPLACE_WHERE, meta, schema, rows, read_set)[0]


def partitions_read_set(
    version: int,
    snapshot: Sequence[FileEntry],
    written: Sequence[FileEntry],
    schema: StructType,
    partition_by: Sequence[str],
) -> ReadSet:
    """The read set of a dynamic partition overwrite that read ``snapshot`` (the files
    of ``version``) and wrote ``written``: it removes the files of the partitions it
    wrote, and reads those partitions (``IN`` over each column's values, left out for a
    column with a NULL partition or values of a kind conditions do not decide)."""
    replaced = {tuple(e.partition.get(c) for c in partition_by) for e in written}
    removes = tuple(
        e.path for e in snapshot if tuple(e.partition.get(c) for c in partition_by) in replaced
    )
    kinds = dml.column_kinds(schema)
    conditions: list[Condition] = []
    for i, column in enumerate(partition_by):
        kind = kinds[column.lower()][1]
        texts = {values[i] for values in replaced}
        literals = [_partition_literal(t, kind) for t in texts]
        clean = [lit for lit in literals if lit is not None]
        if replaced and kind is not None and len(clean) == len(texts):
            conditions.append(Condition(column, IN, kind, tuple(sorted(clean, key=repr))))
    return ReadSet(version, removes, tuple(conditions))


def _partition_literal(text: str | None, kind: str | None) -> int | str | bool | None:
    """A partition folder's value as a condition literal of ``kind``; ``None``: cannot."""
    if text is None or kind is None:
        return None
    try:
        if kind == "int":
            return int(text)
        if kind == "bool":
            return {"true": True, "false": False}[text]
        if kind == "date":
            return datetime.date.fromisoformat(text).isoformat()
    except (ValueError, KeyError):
        return None
    return text
