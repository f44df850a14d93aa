"""``MERGE`` into a lakehouse table: a join of a source DataFrame with the target, copy-on-write.

The builder (:class:`MergeBuilder`) collects clauses as delta-spark's and deltalake's
do; :meth:`MergeBuilder.execute` runs the statement in the steps of ``dml``:

1. **Check**: the merge predicate, every clause's predicate and every expression are
   analysed by Spark (matched clauses against both sides, insert clauses against the
   source, ``not matched by source`` clauses against the target), before anything is
   read or written.
2. **Prune**: the source is numbered and kept (persisted: every job reads the same
   rows, and the user's DataFrame is evaluated once) and one small job reads its row
   count and, for each conjunct ``target.k = source.c`` on a non-partition column,
   the range of ``c``: a target file whose statistics lie outside it holds no row
   that can join (``k >= min AND k <= max`` conditions). The merge predicate's
   conjuncts on target columns alone (``target.day = 'd1'``) become conditions, as a
   ``DELETE``'s predicate does; a conjunct equating a target partition column with
   a source column (``target.day = source.day``) becomes ``day IN (<the source's
   distinct values>)``, one small Spark job. ``not matched by source`` clauses read
   the rows their own predicates may match, whatever the join. A source of at most
   :data:`BROADCAST_CELLS` cells is broadcast, so the target is never shuffled.
3. **Find** (:func:`_find`): one Spark job joins the candidate files' rows with the
   source and counts, per file, the rows that joined a source row and the rows each
   clause changes. A target row joined by several source rows that a matched clause
   would act on fails the statement, as Delta does (unless the only matched clause
   is an unconditional delete), committing nothing. The joined rows that matched
   or are acted on are kept: the change rows and the inserts come from them.
4. **Rewrite and commit** (``dml.commit_rewrite``): one Spark job (:func:`_write_both`)
   writes the rewritten files holding changed rows (read and joined again: only
   those files), the inserted rows (source rows whose numbers no kept row has: no
   second join with the target) and the change files (pre-images and deletes from
   the kept rows; post-images and inserts are the same rows as the data files'),
   committed as one new version; the row counts come from the find job and the
   written files' reports, never from a count job.
   Its read set: the version read, the rewritten files, the files holding rows that
   joined a source row (an insert depends on their rows not matching: they must still
   be live), and the conditions of step 2, widened over the matched rows and the
   ``not matched by source`` ones (``read_set.widen``).

Clauses apply in order, the first whose predicate holds wins, as in Delta.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import pickle
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_integration.engine.model import MERGE, DmlResult, FileEntry, TableMeta
from spark_integration.engine.read_set import IN, Condition, ReadSet, widen
from spark_integration.spark import changes, dml, merge_arrow
from spark_integration.spark.hook import Job
from spark_integration.spark.reads import read_version
from spark_integration.spark.schema import quote

if TYPE_CHECKING:
    from spark_integration.engine.catalog import Catalog
    from spark_integration.service.client import RemoteCatalog

log = logging.getLogger(__name__)

UPDATE, DELETE, INSERT, DELETE_BY_SOURCE = "update", "delete", "insert", "delete_by_source"
#: Columns the statement adds to the rows it joins; never table columns (``_lh_``).
_FILE, _ROW, _SRC, _ACTION = "_lh_dml_file", "_lh_dml_row", "_lh_merge_src", "_lh_merge_action"
_JOINED, _N, _SRC_ID = "_lh_merge_joined", "_lh_merge_n", "_lh_merge_src_id"
_DATA = "_lh_merge_data"  # a row of the new data files (else a change row only)
#: At most this many distinct source values prune the target's partitions; more
#: would make a long condition for little gain, so the partitions are not pruned.
MAX_PARTITION_VALUES = 1000
#: A source of at most this many cells (rows x columns) is broadcast to the join's
#: tasks: the target is then read where it lies, never shuffled. Spark's own size
#: estimate of a DataFrame is often unknown (a Python source) or far off.
BROADCAST_CELLS = 4_000_000
_ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Clause:
    """One ``WHEN`` clause: ``updates`` maps target columns to SQL expressions
    (``None``: every column from the source column of the same name)."""

    kind: str  # UPDATE, DELETE, INSERT or DELETE_BY_SOURCE
    predicate: str | None
    updates: Mapping[str, str] | None = None


@dataclass(slots=True)
class MergeBuilder:
    """``lh.merge(...)``: add clauses, then :meth:`execute`. Each ``when_*`` returns the builder."""

    catalog: Catalog | RemoteCatalog
    table: str
    source: DataFrame
    predicate: str
    source_alias: str
    target_alias: str
    spark: SparkSession | None
    clauses: list[Clause] = field(default_factory=list)

    def _add(self, clause: Clause) -> MergeBuilder:
        if clause.predicate is not None and not isinstance(clause.predicate, str):
            raise TypeError(f"a {clause.kind} clause's predicate must be a SQL string or None")
        self.clauses.append(clause)
        return self

    def when_matched_update(
        self, updates: Mapping[str, str], predicate: str | None = None
    ) -> MergeBuilder:
        """Set ``updates`` (target column: expression over both sides) on matched rows."""
        return self._add(Clause(UPDATE, predicate, _updates(updates, "when_matched_update")))

    def when_matched_update_all(self, predicate: str | None = None) -> MergeBuilder:
        """Set every target column to the source column of the same name on matched rows."""
        return self._add(Clause(UPDATE, predicate, None))

    def when_matched_delete(self, predicate: str | None = None) -> MergeBuilder:
        return self._add(Clause(DELETE, predicate))

    def when_not_matched_insert(
        self, updates: Mapping[str, str], predicate: str | None = None
    ) -> MergeBuilder:
        """Insert a row from a source row no target row matched (unnamed columns: NULL)."""
        return self._add(Clause(INSERT, predicate, _updates(updates, "when_not_matched_insert")))

    def when_not_matched_insert_all(self, predicate: str | None = None) -> MergeBuilder:
        return self._add(Clause(INSERT, predicate, None))

    def when_not_matched_by_source_delete(self, predicate: str | None = None) -> MergeBuilder:
        """Delete target rows no source row matched (``predicate`` over the target)."""
        return self._add(Clause(DELETE_BY_SOURCE, predicate))

    def execute(self) -> DmlResult:
        """Run the statement; see the module docstring."""
        return _execute(self)


def _updates(updates: object, where: str) -> Mapping[str, str]:
    if not isinstance(updates, Mapping) or not updates:
        raise TypeError(f"{where}: updates must be a non-empty dict of column -> SQL expression")
    return dict(updates)


def merge(
    catalog: Catalog | RemoteCatalog,
    name: str,
    source: DataFrame,
    predicate: str,
    source_alias: str,
    target_alias: str,
    spark: SparkSession | None,
) -> MergeBuilder:
    """The builder of ``MERGE INTO name USING source ON predicate``; arguments checked here."""
    if not isinstance(source, DataFrame):
        raise TypeError(f"merge source must be a pyspark DataFrame, got {type(source).__name__}")
    if source.isStreaming:
        raise TypeError("merge source must not be streaming; merge each batch in foreachBatch")
    if not isinstance(predicate, str) or not predicate.strip():
        raise ValueError("merge needs a predicate (a Spark SQL string joining source and target)")
    for label, alias in (("source_alias", source_alias), ("target_alias", target_alias)):
        if not isinstance(alias, str) or not _ALIAS.fullmatch(alias):
            raise ValueError(f"{label} must be a plain SQL identifier, got {alias!r}")
    if source_alias.lower() == target_alias.lower():
        raise ValueError(f"source_alias and target_alias must differ, both are {source_alias!r}")
    return MergeBuilder(catalog, name, source, predicate, source_alias, target_alias, spark)


# --- step 1: check ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """A checked statement: clauses with their updates resolved to table columns."""

    what: str
    schema: StructType
    meta: TableMeta
    version: int
    predicate: str
    clauses: tuple[Clause, ...]
    t: str  # target alias
    s: str  # source alias

    def of(self, *kinds: str) -> list[tuple[int, Clause]]:
        return [(i, c) for i, c in enumerate(self.clauses) if c.kind in kinds]


def _check(m: MergeBuilder, session: SparkSession, *, analyse: bool = True) -> Plan:
    """The statement, checked. Without ``analyse``: only what needs no Spark (the
    clauses' columns resolved); the Arrow path then decides whether it can run it."""
    prepared = m.catalog.prepare(m.table)
    meta, version = prepared.meta, prepared.head.version
    schema = StructType.fromJson(json.loads(meta.schema_json))
    what = f"merge into table {m.table!r}"
    if not m.clauses:
        raise ValueError(f"{what}: add at least one when_* clause before execute()")
    sides: dict[str, DataFrame] = {}
    if analyse:
        t = session.createDataFrame([], schema).alias(m.target_alias)
        s = session.createDataFrame([], m.source.schema).alias(m.source_alias)
        both = t.crossJoin(s)
        sides = {UPDATE: both, DELETE: both, INSERT: s, DELETE_BY_SOURCE: t}
        _analyse(
            functools.partial(both.filter, m.predicate),
            what,
            f"invalid merge predicate {m.predicate!r}",
        )
    clauses: list[Clause] = []
    for clause in m.clauses:
        side = sides.get(clause.kind)
        if clause.predicate is not None and side is not None:
            _analyse(
                functools.partial(side.filter, clause.predicate),
                what,
                f"invalid {clause.kind} clause predicate",
            )
        updates = _resolve(schema, m.source.schema, clause, m.source_alias, what)
        if updates and side is not None:
            exprs = [dml.cast_to_column(schema, c, e) for c, e in updates.items()]
            _analyse(
                functools.partial(side.selectExpr, *exprs),
                what,
                f"invalid {clause.kind} clause expression",
            )
        clauses.append(Clause(clause.kind, clause.predicate, updates))
    return Plan(
        what, schema, meta, version, m.predicate, tuple(clauses), m.target_alias, m.source_alias
    )


def _analyse(build: Callable[[], DataFrame], what: str, problem: str) -> None:
    """Spark's analysis of the DataFrame ``build`` makes (classic analyses eagerly)."""
    try:
        dml.analysed(build())
    except Exception as exc:  # pyspark's analysis and parse errors have no common base
        raise ValueError(f"{what}: {problem}: {dml.spark_error(exc)}") from exc


def _resolve(
    schema: StructType, source: StructType, clause: Clause, s: str, what: str
) -> dict[str, str]:
    """A clause's updates by the table's own column names (``*_all``: from the source)."""
    if clause.kind in (DELETE, DELETE_BY_SOURCE):
        return {}
    if clause.updates is None:
        have = {f.name.lower(): f.name for f in source.fields}
        missing = [c for c in schema.fieldNames() if c.lower() not in have]
        if missing:
            raise ValueError(
                f"{what}: {clause.kind}_all needs every table column in the source; "
                f"it has no {missing}"
            )
        return {c: f"{s}.{quote(have[c.lower()])}" for c in schema.fieldNames()}
    by_lower = {f.name.lower(): f.name for f in schema.fields}
    out: dict[str, str] = {}
    for column, expression in clause.updates.items():
        name = column.rsplit(".", 1)[-1].strip("`") if isinstance(column, str) else None
        found = by_lower.get(name.lower()) if name else None
        if found is None:
            raise ValueError(
                f"{what}: no column {column!r} to set; the table has {schema.fieldNames()}"
            )
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"{what}: the expression for {found!r} must be a SQL string")
        if found in out:
            raise ValueError(f"{what}: column {found!r} is set twice in one clause")
        out[found] = expression
    return out


# --- step 2: which target rows the statement reads ------------------------------------


def target_conditions(
    predicate: str | None, schema: StructType, alias: str, source_columns: Sequence[str]
) -> list[Condition]:
    """Conditions from the conjuncts of ``predicate`` on target columns alone.

    A column counts as the target's when qualified with ``alias`` or, unqualified,
    when the source has no column of that name (else Spark would call it ambiguous).
    """
    conjuncts = dml.conjuncts_of(predicate)
    if conjuncts is None:
        return []
    kinds = dml.column_kinds(schema)
    unqualified = {k: v for k, v in kinds.items() if k not in {c.lower() for c in source_columns}}
    prefix = re.compile(rf"^\s*`?{re.escape(alias)}`?\s*\.\s*", re.IGNORECASE)
    out: list[Condition] = []
    for text in conjuncts:
        stripped = prefix.sub("", text, count=1)
        condition = dml.condition_of(stripped, kinds if stripped != text else unqualified)
        if condition is not None:
            out.append(condition)
    return out


def partition_pairs(
    predicate: str, partition_by: Sequence[str], t: str, s: str, source_columns: Sequence[str]
) -> dict[str, str]:
    """Target partition column -> source column, for each conjunct ``t.p = s.c``."""
    conjuncts = dml.conjuncts_of(predicate) or []
    ident = r"`?([A-Za-z_][A-Za-z0-9_]*)`?"
    pattern = re.compile(rf"{ident}\s*\.\s*{ident}\s*==?\s*{ident}\s*\.\s*{ident}")
    partitions = {c.lower(): c for c in partition_by}
    sources = {c.lower(): c for c in source_columns}
    out: dict[str, str] = {}
    for text in conjuncts:
        match = pattern.fullmatch(text.strip())
        if match is None:
            continue
        a1, c1, a2, c2 = match.groups()
        for (ta, tc), (sa, sc) in (((a1, c1), (a2, c2)), ((a2, c2), (a1, c1))):
            sides = ta.lower() == t.lower() and sa.lower() == s.lower()
            if sides and tc.lower() in partitions and sc.lower() in sources:
                out[partitions[tc.lower()]] = sources[sc.lower()]
    return out


def partition_literal(value: object, kind: str | None) -> int | str | bool | None:
    """A source value as a condition literal of the partition column's kind, if it is one."""
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if (
        kind == "date"
        and isinstance(value, datetime.date)
        and not isinstance(value, datetime.datetime)
    ):
        return value.isoformat()
    return None


def _source_partitions(plan: Plan, source: DataFrame) -> list[Condition] | None:
    """``p IN (values)`` for each partition column the predicate equates with a source
    column, from the source's distinct values there (one small Spark job)."""
    pairs = partition_pairs(
        plan.predicate, plan.meta.partition_by, plan.t, plan.s, source.schema.fieldNames()
    )
    if not pairs:
        return []
    columns = list(dict.fromkeys(pairs.values()))
    rows = source.select(*[quote(c) for c in columns]).distinct().limit(MAX_PARTITION_VALUES + 1)
    return partition_conditions(plan, pairs, rows.collect())


def partition_conditions(
    plan: Plan, pairs: Mapping[str, str], found: Sequence[Any]
) -> list[Condition] | None:
    """``p IN (values)`` for each pair of ``pairs`` (target partition column -> source
    column), from ``found``: the source's distinct rows of those columns (each indexed
    by column name), at most ``MAX_PARTITION_VALUES + 1`` of them. ``None`` when the
    source has no non-null value there (no row can match); no condition when there are
    too many values."""
    if len(found) > MAX_PARTITION_VALUES:
        return []
    kinds = dml.column_kinds(plan.schema)
    out: list[Condition] = []
    for target, column in pairs.items():
        kind = kinds[target.lower()][1]
        values = {row[column] for row in found} - {None}
        if not values:
            return None
        literals = [lit for v in values if (lit := partition_literal(v, kind)) is not None]
        if kind is None or len(literals) != len(values):
            continue  # Spark would cast: the values are not the column's own kind
        out.append(Condition(target, IN, kind, tuple(sorted(literals, key=repr))))
    return out


@dataclass(frozen=True, slots=True)
class _Source:
    """The source as the statement reads it: each row numbered (``_SRC_ID``, so an
    insert is told by the find job's matches instead of a second join with the
    target) and kept (persisted, so every job reads the same rows and evaluates the
    user's DataFrame once); its row count; and the range of each source column the
    predicate equates with a non-partition target column, as conditions."""

    df: DataFrame
    rows: int
    ranges: list[Condition] | None  # None: a key is NULL in every source row

    @property
    def broadcast(self) -> bool:
        return self.rows * max(len(self.df.columns), 1) <= BROADCAST_CELLS


def _profile(plan: Plan, source: DataFrame) -> _Source:
    """Number and keep the source, and read its row count and key ranges in one
    small job (the first to read it)."""
    numbered = source.withColumn(_SRC_ID, F.monotonically_increasing_id()).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    pairs = range_pairs(plan, source.schema)
    aggregates = [F.count(F.lit(1)).alias("n")]
    for i, column in enumerate(pairs.values()):
        aggregates += [F.min(quote(column)).alias(f"lo{i}"), F.max(quote(column)).alias(f"hi{i}")]
    row = numbered.agg(*aggregates).collect()[0]
    bounds = [(row[f"lo{i}"], row[f"hi{i}"]) for i in range(len(pairs))]
    return _Source(numbered, int(row["n"]), range_conditions(plan, pairs, bounds))


def range_pairs(plan: Plan, source: StructType) -> dict[str, str]:
    """Target column -> source column, for each conjunct ``t.k = s.c`` on a
    non-partition column whose statistics can bound it (same kind on both sides)."""
    kinds = dml.column_kinds(plan.schema)
    of_source = {f.name: dml.value_kind(f.dataType) for f in source.fields}
    columns = [c for c in plan.schema.fieldNames() if c not in plan.meta.partition_by]
    return {
        target: column
        for target, column in partition_pairs(
            plan.predicate, columns, plan.t, plan.s, source.fieldNames()
        ).items()
        if kinds[target.lower()][1] in ("int", "str", "date")
        and of_source[column] == kinds[target.lower()][1]
    }


def range_conditions(
    plan: Plan, pairs: Mapping[str, str], bounds: Sequence[tuple[object, object]]
) -> list[Condition] | None:
    """``k >= min AND k <= max`` for each pair, from the source column's ``bounds``
    (in the order of ``pairs``). A target file whose statistics lie outside a range
    holds no row that can join a source row (``t.k = s.k`` is false or NULL).
    ``None``: a key is NULL in every source row, so no target row joins."""
    kinds = dml.column_kinds(plan.schema)
    ranges: list[Condition] = []
    for target, (low_value, high_value) in zip(pairs, bounds, strict=True):
        kind = kinds[target.lower()][1]
        if kind is None or low_value is None:
            return None
        low, high = partition_literal(low_value, kind), partition_literal(high_value, kind)
        if low is not None and high is not None:
            ranges.append(Condition(target, ">=", kind, (low,)))
            ranges.append(Condition(target, "<=", kind, (high,)))
    return ranges


def _alternatives(plan: Plan, source: _Source) -> list[tuple[Condition, ...]]:
    partitions = _source_partitions(plan, source.df) if source.ranges is not None else None
    return alternatives(plan, source.df.schema.fieldNames(), source.ranges, partitions)


def alternatives(
    plan: Plan,
    source_columns: Sequence[str],
    ranges: list[Condition] | None,
    partitions: list[Condition] | None,
) -> list[tuple[Condition, ...]]:
    """The kinds of target rows the statement reads, each as a conjunction: the rows
    that may join a source row (``ranges`` and ``partitions`` from the source; ``None``:
    none can) and those a ``not matched by source`` clause may act on."""
    out: list[tuple[Condition, ...]] = []
    if partitions is not None and ranges is not None:
        matched = target_conditions(plan.predicate, plan.schema, plan.t, source_columns)
        out.append(tuple(matched + partitions + ranges))
    for _, clause in plan.of(DELETE_BY_SOURCE):
        out.append(tuple(target_conditions(clause.predicate, plan.schema, plan.t, ())))
    return out


# --- steps 3 and 4: find the rows each clause changes, rewrite -------------------------


def _action(plan: Plan) -> str:
    """SQL: the index of the clause that acts on a joined row, NULL for none."""

    def first(clauses: list[tuple[int, Clause]]) -> str:
        if not clauses:
            return "CAST(NULL AS INT)"
        whens = " ".join(f"WHEN {dml.matching(c.predicate)} THEN {i}" for i, c in clauses)
        return f"CASE {whens} ELSE NULL END"

    matched = first(plan.of(UPDATE, DELETE))
    by_source = first(plan.of(DELETE_BY_SOURCE))
    return f"CASE WHEN {_SRC} IS NULL THEN {by_source} ELSE {matched} END"


def _joined(
    plan: Plan, session: SparkSession, source: _Source, files: Sequence[FileEntry], how: str
) -> DataFrame:
    meta = plan.meta
    target = read_version(session, plan.schema, meta.partition_by, meta.location, files)
    tagged = target.selectExpr(
        "*", f"input_file_name() AS {_FILE}", f"monotonically_increasing_id() AS {_ROW}"
    ).alias(plan.t)
    marked = source.df.selectExpr("*", f"true AS {_SRC}")
    if source.broadcast:
        marked = F.broadcast(marked)
    return tagged.join(marked.alias(plan.s), F.expr(plan.predicate), how).withColumn(
        _ACTION, F.expr(_action(plan))
    )


@dataclass(slots=True)
class _Counts:
    """Per file: rows that joined a source row, rows each clause kind changes."""

    joined: int = 0
    changed: dict[str, int] = field(default_factory=dict)


def _find(
    plan: Plan, session: SparkSession, source: _Source, files: Sequence[FileEntry]
) -> tuple[dict[str, _Counts], int, DataFrame]:
    """Each candidate file's counts, the most source rows joined to one target row,
    and the joined rows the statement acts on or that matched a source row, kept:
    the change rows and the inserts are read from them, not from a second join."""
    how = "left" if plan.of(DELETE_BY_SOURCE) else "inner"
    found = (
        _joined(plan, session, source, files, how)
        .filter(f"{_SRC} IS NOT NULL OR {_ACTION} IS NOT NULL")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    # Clustered by file, both aggregations run where the rows are: one shuffle, not two.
    per_row = (
        found.repartition(_FILE)
        .groupBy(_FILE, _ROW)
        .agg(
            F.count(_SRC).alias(_N),
            F.min(_ACTION).alias(_ACTION),
            F.count(_ACTION).alias("_lh_merge_acting"),
            F.first(F.expr(_as_json(plan))).alias("_lh_merge_sample"),
        )
    )
    per_file = per_row.groupBy(_FILE, _ACTION).agg(
        F.count("*").alias("rows"),
        F.sum(F.expr(f"CAST({_N} > 0 AS INT)")).alias(_JOINED),
        F.max(_N).alias(_N),
        F.max("_lh_merge_acting").alias("acting"),
        # The row acted on most often: named in the error if that is more than once.
        F.max_by("_lh_merge_sample", "_lh_merge_acting").alias("sample"),
    )
    by_path = {e.path: e for e in files}
    counts: dict[str, _Counts] = {}
    most, acting, sample = 0, 0, ""
    for row in per_file.collect():
        path = dml.relative_path(row[_FILE], by_path)
        c = counts.setdefault(path, _Counts())
        c.joined += int(row[_JOINED] or 0)
        most = max(most, int(row[_N] or 0))
        if int(row["acting"] or 0) > acting:
            acting, sample = int(row["acting"]), str(row["sample"])
        if row[_ACTION] is not None:
            kind = plan.clauses[int(row[_ACTION])].kind
            c.changed[kind] = c.changed.get(kind, 0) + int(row["rows"])
    if acting > 1 and not only_unconditional_delete(plan):
        found.unpersist()
        raise ambiguous_match(plan, acting, sample)
    return counts, most, found


def only_unconditional_delete(plan: Plan) -> bool:
    """Whether the only matched clause deletes every matched row: a target row joined
    by several source rows is then deleted once, not an error."""
    matched = plan.of(UPDATE, DELETE)
    return len(matched) == 1 and matched[0][1].kind == DELETE and matched[0][1].predicate is None


def ambiguous_match(plan: Plan, acting: int, sample: str) -> ValueError:
    """Delta's error for a target row that ``acting`` source rows would change."""
    return ValueError(
        f"{plan.what}: a target row matched {acting} source rows and a matched clause "
        "would change it for each; as in Delta, a target row may be changed by one "
        "source row only. Nothing was committed. Deduplicate the source on the merge "
        f"keys ({plan.predicate!r}) first. The target row: {sample}"
    )


def _as_json(plan: Plan) -> str:
    """SQL: the target row as JSON, to name it in an error."""
    names = plan.schema.fieldNames()
    fields = ", ".join(f"'{c.replace(chr(39), '')}', {plan.t}.{quote(c)}" for c in names)
    return f"to_json(named_struct({fields}))"


def _rewrite(
    plan: Plan,
    session: SparkSession,
    source: _Source,
    touched: Sequence[FileEntry],
    dedupe: bool,
) -> DataFrame:
    """The rows that replace ``touched``: each changed by the first clause that acts."""
    rows = _once(_joined(plan, session, source, touched, "left"), dedupe)
    kinds = {i: c.kind for i, c in enumerate(plan.clauses)}
    dropped = [str(i) for i, kind in kinds.items() if kind in (DELETE, DELETE_BY_SOURCE)]
    if dropped:
        rows = rows.filter(f"{_ACTION} IS NULL OR {_ACTION} NOT IN ({', '.join(dropped)})")
    # An updated row is also the change feed's post-image: written to both kinds of file.
    updating = ", ".join(str(i) for i, _ in plan.of(UPDATE)) or "NULL"
    post = f"CASE WHEN {_ACTION} IN ({updating}) THEN '{changes.UPDATE_POSTIMAGE}' END"
    return rows.selectExpr(
        *_updated_columns(plan), f"{post} AS {changes.CHANGE_TYPE}", f"true AS {_DATA}"
    )


def _once(rows: DataFrame, dedupe: bool) -> DataFrame:
    """``rows`` (joined), each target row once with its ``_ACTION``."""
    if dedupe:
        # Several source rows joined one target row; at most one of them is acted on
        # (or each deletes it): that copy, else any (they are the same row), is kept.
        first = f"row_number() OVER (PARTITION BY {_FILE}, {_ROW} ORDER BY {_ACTION} NULLS LAST)"
        rows = rows.withColumn("_lh_merge_rank", F.expr(first)).filter("_lh_merge_rank = 1")
    return rows


def _updated_columns(plan: Plan) -> list[str]:
    """SQL: each table column of an acted row as the update clause acting on it sets it."""
    columns = []
    for name in plan.schema.fieldNames():
        kind = plan.schema[name].dataType.simpleString()
        whens = " ".join(
            f"WHEN {i} THEN CAST(({c.updates[name]}) AS {kind})"
            for i, c in plan.of(UPDATE)
            if c.updates and name in c.updates
        )
        target = f"{plan.t}.{quote(name)}"
        value = f"CASE {_ACTION} {whens} ELSE {target} END" if whens else target
        columns.append(f"{value} AS {quote(name)}")
    return columns


def _removed_rows(plan: Plan, found: DataFrame, dedupe: bool) -> DataFrame:
    """The change feed rows no data file holds: the pre-image of each updated row and
    each deleted row, from the find job's kept rows (``found``), never a copied row."""
    acted = _once(found, dedupe).filter(f"{_ACTION} IS NOT NULL")
    updating = ", ".join(str(i) for i, _ in plan.of(UPDATE)) or "NULL"
    targets = [f"{plan.t}.{quote(name)} AS {quote(name)}" for name in plan.schema.fieldNames()]
    kind = (
        f"CASE WHEN {_ACTION} IN ({updating}) THEN '{changes.UPDATE_PREIMAGE}' "
        f"ELSE '{changes.DELETE_ROW}' END AS {changes.CHANGE_TYPE}"
    )
    return acted.selectExpr(*targets, kind, f"false AS {_DATA}")


def _write_both(
    out: DataFrame, schema: StructType, partition_by: tuple[str, ...], job: Job
) -> tuple[list[FileEntry], list[FileEntry]]:
    """Write ``out`` in one Spark job: rows marked ``_DATA`` as data files, rows with a
    ``_change_type`` as change files (an updated or inserted row is both), as
    ``hook.write_files`` and ``changes.write_change_files`` would in two jobs.

    Each task streams its data rows to their files and holds its change rows (the
    changed rows only, a small part of a rewrite) until they are written after.
    """
    columns = tuple(schema.fieldNames())
    change_columns = (*columns, changes.CHANGE_TYPE)
    location, staging, change_tag = job.location, job.staging, changes.CHANGE_FILE_TAG
    ordered = out.select(*[quote(c) for c in (*change_columns, _DATA)])

    def write_task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from spark_integration.spark.datasource.files import write_batches
        from spark_integration.spark.datasource.write_plan import task_tag

        held: list[Any] = []

        def data_rows() -> Iterator[Any]:
            for batch in batches:
                is_change = pc.is_valid(batch.column(changes.CHANGE_TYPE))
                if pc.any(is_change).as_py():
                    held.append(batch.filter(is_change))
                yield batch.filter(batch.column(_DATA))

        def write(rows: Iterator[Any], columns: tuple[str, ...], tag: str) -> list[FileEntry]:
            return write_batches(
                rows,
                location=location,
                staging=staging,
                columns=columns,
                partition_by=partition_by,
                tag=tag,
            )

        tag = task_tag()
        data = write(data_rows(), columns, tag)
        kept = write(iter(held), change_columns, change_tag + tag)
        reports = [pickle.dumps((False, e)) for e in data] + [pickle.dumps((True, e)) for e in kept]
        yield pa.RecordBatch.from_arrays([pa.array(reports, pa.binary())], names=["entry"])

    data_files: list[FileEntry] = []
    change_files: list[FileEntry] = []
    for row in ordered.mapInArrow(write_task, "entry binary").collect():
        is_change, entry = pickle.loads(row["entry"])
        (change_files if is_change else data_files).append(entry)
    return data_files, change_files


def _inserts(plan: Plan, source: _Source, found: DataFrame | None) -> DataFrame:
    """The rows the insert clauses add: from source rows no target row joined, told by
    their numbers among the find job's matches (no second join with the target)."""
    unmatched = source.df
    if found is not None:
        joined = found.filter(f"{_SRC} IS NOT NULL").select(_SRC_ID)
        if source.broadcast:
            joined = F.broadcast(joined)
        unmatched = unmatched.join(joined, _SRC_ID, "left_anti")
    inserts = plan.of(INSERT)
    whens = " ".join(f"WHEN {dml.matching(c.predicate)} THEN {i}" for i, c in inserts)
    chosen = unmatched.alias(plan.s).withColumn(_ACTION, F.expr(f"CASE {whens} ELSE NULL END"))
    chosen = chosen.alias(plan.s).filter(f"{_ACTION} IS NOT NULL")
    columns = []
    for name in plan.schema.fieldNames():
        kind = plan.schema[name].dataType.simpleString()
        whens = " ".join(
            f"WHEN {i} THEN CAST(({c.updates[name]}) AS {kind})"
            for i, c in inserts
            if c.updates and name in c.updates
        )
        value = f"CASE {_ACTION} {whens} ELSE NULL END" if whens else "NULL"
        columns.append(f"CAST({value} AS {kind}) AS {quote(name)}")
    return chosen.selectExpr(
        *columns, f"'{changes.INSERT}' AS {changes.CHANGE_TYPE}", f"true AS {_DATA}"
    )


def _execute(m: MergeBuilder) -> DmlResult:
    # The source's own session unless told otherwise: the join needs both in one.
    session = dml.session_of(m.spark) if m.spark is not None else m.source.sparkSession
    fast = _in_arrow(m, session)
    if fast is not None:
        return fast
    plan = _check(m, session)
    _, _, entries = m.catalog.files(m.table, plan.version, FileEntry)
    source = _profile(plan, m.source)
    found: DataFrame | None = None
    try:
        alternatives = _alternatives(plan, source)
        candidates = [
            e for e in entries if any(ReadSet(0, (), alt).may_match(e) for alt in alternatives)
        ]
        counts: dict[str, _Counts] = {}
        most = 0
        if candidates:
            counts, most, found = _find(plan, session, source, candidates)
        found_rows = _Found(candidates, counts, most, found)
        return _write(m, plan, session, source, entries, alternatives, found_rows)
    finally:
        if found is not None:
            found.unpersist()
        source.df.unpersist()


def _in_arrow(m: MergeBuilder, session: SparkSession) -> DmlResult | None:
    """The statement run by the Arrow path, or ``None`` when that path cannot run it.

    Spark's analysis (a few Spark calls) is skipped: a statement the Arrow path takes
    is valid by construction (keys and values are columns of the two sides, compared
    in one kind, cast only to wider types; partition conditions of literals of the
    column's kind), as long as Spark resolves names as the Arrow path does, case-
    insensitively. A statement it does not take, or one that fails the resolution,
    is checked in full by the Spark path, which raises Spark's error.
    """
    if str(session.conf.get("spark.sql.caseSensitive", "false")).lower() != "false":
        return None
    try:
        plan = _check(m, session, analyse=False)
    except ValueError:
        return None
    return merge_arrow.execute(m, plan)


@dataclass(frozen=True, slots=True)
class _Found:
    """What step 3 found: the candidate files, their counts, the most source rows
    joined to one target row, and the kept joined rows (``None``: no candidate)."""

    candidates: list[FileEntry]
    counts: dict[str, _Counts]
    most: int
    rows: DataFrame | None


def _write(
    m: MergeBuilder,
    plan: Plan,
    session: SparkSession,
    source: _Source,
    entries: Sequence[FileEntry],
    alternatives: list[tuple[Condition, ...]],
    f: _Found,
) -> DmlResult:
    """Step 4: rewrite the files holding changed rows, write the inserts, commit."""
    candidates, counts, most, found = f.candidates, f.counts, f.most, f.rows
    none = _Counts()
    touched = [e for e in candidates if counts.get(e.path, none).changed]
    kept = [
        e
        for e in candidates
        if not counts.get(e.path, none).changed and counts.get(e.path, none).joined
    ]
    changed = {UPDATE: 0, DELETE: 0, DELETE_BY_SOURCE: 0}
    for c in counts.values():
        for kind, n in c.changed.items():
            changed[kind] += n
    log.info(
        "%s: %d of %d files may hold rows it reads, %d hold rows it changes (version %d)",
        plan.what,
        len(candidates),
        len(entries),
        len(touched),
        plan.version,
    )
    parts: list[DataFrame] = []
    if touched:
        parts.append(_rewrite(plan, session, source, touched, most > 1))
    if found is not None and plan.of(UPDATE, DELETE, DELETE_BY_SOURCE):
        parts.append(_removed_rows(plan, found, most > 1))
    if plan.of(INSERT):
        parts.append(_inserts(plan, source, found))
    out = functools.reduce(lambda a, b: a.unionByName(b), parts) if parts else None
    meta = plan.meta
    read_set = ReadSet(
        plan.version,
        tuple(e.path for e in touched),
        widen(alternatives),
        tuple(e.path for e in kept),
    )
    writer = (
        None if out is None else functools.partial(_write_both, out, plan.schema, meta.partition_by)
    )
    version, written = dml.commit_rewrite(m.catalog, MERGE, meta, plan.schema, writer, read_set)
    deleted = changed[DELETE] + changed[DELETE_BY_SOURCE]
    carried = sum(e.record_count for e in touched) - deleted
    return DmlResult(
        version,
        rows_inserted=sum(e.record_count for e in written) - carried if written else 0,
        rows_updated=changed[UPDATE],
        rows_deleted=deleted,
        files_added=len(written),
        files_removed=len(touched),
    )
