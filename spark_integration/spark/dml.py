"""Row-level DML (``DELETE``, ``UPDATE``) on lakehouse tables: copy-on-write over Parquet.

A statement runs in four steps, each one readable below:

1. **Check** (:func:`check_predicate`, :func:`_check_updates`): the predicate and the
   update expressions are analysed by Spark against the table's schema, so a typo, an
   unknown column or an expression of the wrong kind fails here, before any file is
   read or written.
2. **Prune** (:func:`conditions_of`): the predicate's simple conjuncts (``col = lit``,
   ``<``, ``<=``, ``>``, ``>=``, ``IN``, ``IS [NOT] NULL`` over integer, string, boolean
   and date columns) become engine :class:`Condition` s; files whose partition values
   or column statistics rule them out are never read. Conjuncts not understood are
   left out, which only ever keeps more files.
3. **Find** (:func:`count_matches`): one Spark job counts each candidate file's rows
   and matching rows. Files with no match are untouched. When the conditions decide
   the predicate exactly (only partition columns, every conjunct understood) or there
   is no predicate, the counts come from the catalog and no file is read.
4. **Rewrite and commit**: the touched files' rows are written once, at their final
   paths, by the same Spark tasks ``Lakehouse.append`` uses (``hook.write_files``):
   ``DELETE`` keeps the rows not matching (a file whose every row matches is dropped
   without a replacement); ``UPDATE`` rewrites matching rows. The commit carries the
   statement's :class:`ReadSet` (version read, files removed, conditions), checked in
   the engine at the commit point: see ``engine.read_set`` and docs/design/lakehouse.md.

A statement that matches no row commits nothing and returns the version it read,
as deltalake does. ``merge`` and ``replace`` reuse these steps (the checks, the
conditions, the counting and :func:`commit_rewrite`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from spark_integration.engine import lakehouse_failpoints as fp
from spark_integration.engine.model import DELETE, UPDATE, DmlResult, FileEntry, TableMeta
from spark_integration.engine.read_set import IN, IS_NULL, NOT_NULL, Condition, ReadSet
from spark_integration.spark import filesystem
from spark_integration.spark.changes import (
    DELETE_ROW,
    UPDATE_POSTIMAGE,
    UPDATE_PREIMAGE,
    tagged,
    write_change_files,
)
from spark_integration.spark.hook import Job, new_job, write_files
from spark_integration.spark.reads import read_version
from spark_integration.spark.schema import quote
from txn.errors import TransactionAbortedError

if TYPE_CHECKING:
    from spark_integration.engine.catalog import Catalog
    from spark_integration.service.client import RemoteCatalog

log = logging.getLogger(__name__)

#: Columns the statement adds to the rows it reads; never table columns (``_lh_``).
_FILE = "_lh_dml_file"
_MATCH = "_lh_dml_match"
_ROW = "_lh_dml_row"


@dataclass(frozen=True, slots=True)
class Statement:
    """One row-level statement, checked: ``updates`` maps table columns to expressions."""

    operation: str  # DELETE or UPDATE
    table: str
    predicate: str | None
    updates: Mapping[str, str]


def delete(
    catalog: Catalog | RemoteCatalog,
    name: str,
    predicate: str | None,
    spark: SparkSession | None,
) -> DmlResult:
    """``DELETE FROM name WHERE predicate``; see the module docstring."""
    return _run(catalog, Statement(DELETE, name, predicate, {}), spark)


def update(
    catalog: Catalog | RemoteCatalog,
    name: str,
    updates: Mapping[str, str],
    predicate: str | None,
    spark: SparkSession | None,
) -> DmlResult:
    """``UPDATE name SET col = expr, ... WHERE predicate``; see the module docstring."""
    return _run(catalog, Statement(UPDATE, name, predicate, updates), spark)


def session_of(spark: SparkSession | None) -> SparkSession:
    if spark is None:
        # The thread's active session, else the process's default one.
        return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
    if not isinstance(spark, SparkSession):
        raise TypeError(f"spark must be a SparkSession, got {type(spark).__name__}")
    return spark


def _run(catalog: Catalog | RemoteCatalog, st: Statement, spark: SparkSession | None) -> DmlResult:
    session = session_of(spark)
    prepared = catalog.prepare(st.table)
    meta, version = prepared.meta, prepared.head.version
    schema = StructType.fromJson(json.loads(meta.schema_json))
    what = f"{st.operation.lower()} on table {st.table!r}"
    predicate = check_predicate(session, schema, st.predicate, what)
    updates = _check_updates(session, schema, st.updates, what, st.operation == UPDATE)
    conditions, exact = conditions_of(predicate, schema, meta.partition_by)
    _, _, entries = catalog.files(st.table, version, FileEntry)
    probe = ReadSet(version, (), conditions)
    candidates = [e for e in entries if probe.may_match(e)]
    if predicate is None or exact:
        counts = {e.path: (e.record_count, e.record_count) for e in candidates}
    else:
        counts = count_matches(session, schema, meta, candidates, predicate)
    touched = [e for e in candidates if counts.get(e.path, (0, 0))[1] > 0]
    matched = sum(counts[e.path][1] for e in touched)
    log.info(
        "%s: %d of %d files may match, %d hold %d matching rows (version %d)",
        what,
        len(candidates),
        len(entries),
        len(touched),
        matched,
        version,
    )
    if not touched:
        return DmlResult(version)  # like deltalake: nothing changed, nothing committed
    if st.operation == DELETE:
        rewrite = [e for e in touched if counts[e.path][1] < counts[e.path][0]]
    else:
        rewrite = touched
    rows = None
    if rewrite:
        rows = _rewritten_rows(session, schema, meta, rewrite, predicate, updates)
    changed = _changed_rows(session, schema, meta, touched, predicate, updates)
    read_set = ReadSet(version, tuple(e.path for e in touched), conditions)
    new_version, written = commit_rewrite(
        catalog, st.operation, meta, schema, rows, read_set, changed
    )
    return DmlResult(
        new_version,
        rows_updated=matched if st.operation == UPDATE else 0,
        rows_deleted=matched if st.operation == DELETE else 0,
        files_added=len(written),
        files_removed=len(touched),
    )


def commit_rewrite(
    catalog: Catalog | RemoteCatalog,
    operation: str,
    meta: TableMeta,
    schema: StructType,
    rows: DataFrame | Callable[[Job], tuple[list[FileEntry], list[FileEntry]]] | None,
    read_set: ReadSet | Callable[[list[FileEntry]], ReadSet],
    changes: DataFrame | None = None,
) -> tuple[int, list[FileEntry]]:
    """Write ``rows`` into a new job folder and commit them with ``read_set``: the
    commit step every row-level statement shares. Returns the version and the files.
    ``read_set`` may be a function of the files written (a dynamic partition
    overwrite replaces the partitions it wrote). ``changes``: the changed rows with
    their ``_change_type``, written as change files into the same job folder and
    committed with the version (the change data feed, ``spark.changes``). ``rows``
    may instead be a function writing both kinds into the job in one Spark job
    (``MERGE`` does: one pass instead of two); it returns the data and change files.

    Nothing to remove and no row written: nothing is committed, and the version
    read is returned (as deltalake does for a statement that changes nothing).
    """
    job = new_job(meta.location)
    written: list[FileEntry] = []
    change_files: list[FileEntry] = []
    try:
        if isinstance(rows, DataFrame):
            written = write_files(rows, schema, meta.partition_by, job)
        elif rows is not None:
            written, change_files = rows(job)
        if not isinstance(read_set, ReadSet):
            read_set = read_set(written)
        if not written and not read_set.removes:
            filesystem.delete_tree(job.staging)
            return read_set.version, []
        if changes is not None:
            change_files = write_change_files(changes, schema, meta.partition_by, job)
        catalog.failpoints.hit(fp.BEFORE_COMMIT, job.job_id)
    except Exception:
        filesystem.delete_tree(job.staging)  # no commit was attempted: nothing names them
        raise
    try:
        committed = catalog.commit_files(
            meta.name,
            operation,
            written,
            job_id=job.job_id,
            job_started_ms=job.started_ms,
            read_set=read_set,
            change_files=change_files,
        )
    except TransactionAbortedError:
        # Definitely not committed (a conflict with its read set, a vacuum's fence).
        filesystem.delete_tree(job.staging)
        raise
    # Any other failure leaves the files: the commit may have landed (see
    # ``Lakehouse._run_job``); vacuum removes the files that no version names.
    log.info(
        "%s on table %r committed version %d (job %s)",
        operation.lower(),
        meta.name,
        committed.version,
        job.job_id,
    )
    return committed.version, written


# --- step 1: check --------------------------------------------------------------------


def spark_error(exc: BaseException) -> str:
    """The first line of a Spark analysis or parse error: what is wrong, without the plan."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def analysed(df: DataFrame) -> StructType:
    """The DataFrame's schema: Spark analyses the plan for it (Connect lazily, here)."""
    return df.schema


def check_predicate(
    spark: SparkSession, schema: StructType, predicate: object, what: str
) -> str | None:
    if predicate is None:
        return None
    if not isinstance(predicate, str):
        raise TypeError(f"{what}: predicate must be a SQL string, got {type(predicate).__name__}")
    if not predicate.strip():
        raise ValueError(f"{what}: the predicate is empty (pass None for every row)")
    try:
        analysed(spark.createDataFrame([], schema).filter(predicate))
    except Exception as exc:  # pyspark's analysis and parse errors have no common base
        raise ValueError(f"{what}: invalid predicate {predicate!r}: {spark_error(exc)}") from exc
    return predicate


def _check_updates(
    spark: SparkSession, schema: StructType, updates: object, what: str, required: bool
) -> dict[str, str]:
    """Updates by the table's own column names (Spark resolves names case-insensitively)."""
    if not isinstance(updates, Mapping):
        raise TypeError(f"{what}: updates must be a dict of column -> SQL expression")
    if required and not updates:
        raise ValueError(f"{what}: updates must name at least one column")
    by_lower = {f.name.lower(): f for f in schema.fields}
    out: dict[str, str] = {}
    for column, expression in updates.items():
        field = by_lower.get(column.lower()) if isinstance(column, str) else None
        if field is None:
            raise ValueError(
                f"{what}: no column {column!r} to update; the table has {schema.fieldNames()}"
            )
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"{what}: the expression for {field.name!r} must be a SQL string")
        if field.name in out:
            raise ValueError(f"{what}: column {field.name!r} is updated twice")
        out[field.name] = expression
    if out:
        try:
            empty = spark.createDataFrame([], schema)
            analysed(empty.selectExpr(*[cast_to_column(schema, c, e) for c, e in out.items()]))
        except Exception as exc:
            raise ValueError(f"{what}: invalid update expression: {spark_error(exc)}") from exc
    return out


def cast_to_column(schema: StructType, column: str, expression: str) -> str:
    kind = schema[column].dataType.simpleString()
    return f"CAST(({expression}) AS {kind}) AS {quote(column)}"


# --- step 2: conditions for pruning and for the read set -------------------------------

_IDENT = r"(?:`(?P<{0}q>[^`]+)`|(?P<{0}n>[A-Za-z_][A-Za-z0-9_]*))"
_LITERAL = r"(?:'[^'\\]*'|-?\d+|true|false|date\s*'\d{4}-\d{2}-\d{2}')"
_COMPARISON = re.compile(
    _IDENT.format("c") + r"\s*(?P<op>==|=|<=|>=|<|>)\s*(?P<lit>" + _LITERAL + ")",
    re.IGNORECASE,
)
_IN_LIST = re.compile(
    _IDENT.format("c")
    + r"\s+in\s*\(\s*(?P<lits>"
    + _LITERAL
    + r"(?:\s*,\s*"
    + _LITERAL
    + r")*)\s*\)",
    re.IGNORECASE,
)
_NULL_TEST = re.compile(_IDENT.format("c") + r"\s+is\s+(?P<not>not\s+)?null", re.IGNORECASE)
_ONE_LITERAL = re.compile(_LITERAL, re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def value_kind(kind: DataType) -> str | None:
    """The engine's value kind of a column, if its conditions are decided on."""
    if isinstance(kind, ByteType | ShortType | IntegerType | LongType):
        return "int"
    if isinstance(kind, BooleanType):
        return "bool"
    if isinstance(kind, DateType):
        return "date"
    if isinstance(kind, StringType) and getattr(kind, "collation", "UTF8_BINARY") == "UTF8_BINARY":
        return "str"  # other collations compare differently
    return None


def conditions_of(
    predicate: str | None, schema: StructType, partition_by: Sequence[str]
) -> tuple[tuple[Condition, ...], bool]:
    """The predicate's conjuncts that the engine can decide per file, and whether they
    decide it exactly (every conjunct understood, each on a partition column).

    Only a predicate that Spark already accepted comes here. A conjunct is taken only
    when it is wholly one of the simple forms with a literal of the column's own kind;
    anything else (OR at the top, BETWEEN, functions, casts) is left out, so the
    conditions never rule out a file that holds a matching row.
    """
    conjuncts = conjuncts_of(predicate)
    if conjuncts is None:
        return (), False
    kinds = column_kinds(schema)
    out: list[Condition] = []
    exact = True
    for text in conjuncts:
        condition = condition_of(text, kinds)
        if condition is None:
            exact = False
            continue
        out.append(condition)
        exact = exact and condition.column in partition_by
    return tuple(out), exact


def conjuncts_of(predicate: str | None) -> list[str] | None:
    """The predicate's top-level conjuncts; ``None`` when they cannot be told for sure."""
    if predicate is None or any(mark in predicate for mark in ("--", "/*", "\\")):
        # A comment could hide an AND from Spark, an escape end a string early here.
        return None
    return _conjuncts(predicate)


def column_kinds(schema: StructType) -> dict[str, tuple[str, str | None]]:
    """Column kinds by lower-case name: ``(name, kind)``, kind ``None`` when not decided on."""
    return {f.name.lower(): (f.name, value_kind(f.dataType)) for f in schema.fields}


def _conjuncts(text: str) -> list[str] | None:
    """``text`` split at its top-level ANDs; ``None`` when it has a top-level OR or a
    BETWEEN (whose AND is not a conjunction). Parentheses around a whole conjunct go."""
    pieces: list[str] = []
    depth, start, i, n = 0, 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`":
            end = i + 1
            while end < n and text[end] != ch:
                end += 2 if text[end] == "\\" else 1
            i = end + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and (ch.isalpha() or ch == "_") and (i == 0 or not _word_char(text[i - 1])):
            word = _WORD.match(text, i)
            if word is None:  # a letter outside ASCII: not a keyword
                i += 1
                continue
            upper = word.group().upper()
            if upper in ("OR", "BETWEEN"):
                return None
            if upper == "AND":
                pieces.append(text[start:i])
                start = word.end()
            i = word.end()
            continue
        i += 1
    pieces.append(text[start:])
    out: list[str] = []
    for piece in (p.strip() for p in pieces):
        if piece.startswith("(") and piece.endswith(")") and _wraps(piece):
            inner = _conjuncts(piece[1:-1])
            out.extend(inner if inner is not None else [piece])
        else:
            out.append(piece)
    return out


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _wraps(piece: str) -> bool:
    """Whether the first parenthesis of ``piece`` closes at its very end."""
    depth = 0
    quote_char: str | None = None
    for i, ch in enumerate(piece):
        if quote_char is not None:
            quote_char = None if ch == quote_char else quote_char
            continue
        if ch in "'\"`":
            quote_char = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i == len(piece) - 1
    return False


#: Column kinds by lower-case name: ``(name, kind)``, kind ``None`` when not decided on.
_Kinds = dict[str, tuple[str, str | None]]


def _column(match: re.Match[str], kinds: _Kinds) -> tuple[str, str] | None:
    raw = match.group("cq") or match.group("cn")
    found = kinds.get(raw.lower())
    if found is None or found[1] is None:
        return None
    return found[0], found[1]


def _literal(text: str, kind: str) -> int | str | bool | None:
    """A literal of ``kind`` (``None``: another kind, which Spark would cast)."""
    lowered = text.lower()
    if kind == "str" and text.startswith("'"):
        return text[1:-1]
    if kind == "int" and re.fullmatch(r"-?\d+", text):
        return int(text)
    if kind == "bool" and lowered in ("true", "false"):
        return lowered == "true"
    if kind == "date" and lowered.startswith("date"):
        return text[text.index("'") + 1 : -1]
    return None


def condition_of(text: str, kinds: _Kinds) -> Condition | None:
    match = _NULL_TEST.fullmatch(text)
    if match is not None:
        column = _column(match, kinds)
        if column is None:
            return None
        return Condition(column[0], NOT_NULL if match.group("not") else IS_NULL, column[1])
    match = _COMPARISON.fullmatch(text)
    literals: list[str]
    if match is not None:
        op = "=" if match.group("op") == "==" else match.group("op")
        literals = [match.group("lit")]
    else:
        match = _IN_LIST.fullmatch(text)
        if match is None:
            return None
        op = IN
        literals = _ONE_LITERAL.findall(match.group("lits"))
    column = _column(match, kinds)
    if column is None:
        return None
    values = [_literal(lit, column[1]) for lit in literals]
    if any(v is None for v in values):
        return None
    return Condition(column[0], op, column[1], tuple(v for v in values if v is not None))


# --- steps 3 and 4: find the matching rows, rewrite their files -----------------------


def matching(predicate: str | None) -> str:
    """SQL true exactly for the rows the statement touches (a null predicate is not)."""
    return "true" if predicate is None else f"coalesce(({predicate}), false)"


def count_matches(
    spark: SparkSession,
    schema: StructType,
    meta: TableMeta,
    files: Sequence[FileEntry],
    predicate: str,
) -> dict[str, tuple[int, int]]:
    """Each file's ``(rows, matching rows)``, in one Spark job over ``files``."""
    if not files:
        return {}
    rows = read_version(spark, schema, meta.partition_by, meta.location, files)
    tagged = rows.selectExpr(
        f"input_file_name() AS {_FILE}",
        f"1 AS {_ROW}",
        f"CAST({matching(predicate)} AS INT) AS {_MATCH}",
    )
    by_path = {e.path: e for e in files}
    out: dict[str, tuple[int, int]] = {}
    # A dict of aggregates names its columns ``sum(<column>)``, in no promised order.
    for row in tagged.groupBy(_FILE).agg({_ROW: "sum", _MATCH: "sum"}).collect():
        path = relative_path(row[_FILE], by_path)
        out[path] = (int(row[f"sum({_ROW})"]), int(row[f"sum({_MATCH})"]))
    return out


def relative_path(uri: str, by_path: Mapping[str, Any]) -> str:
    """The relative path of the file Spark names ``uri`` (URL-escaped, with a scheme)."""
    plain = unquote(uri)
    for candidate in (plain[plain.find("/_lh_job=") + 1 :], plain):
        if candidate in by_path:
            return candidate
    for path in by_path:  # a file outside a job folder (a hand-made table)
        if plain.endswith("/" + path):
            return path
    raise RuntimeError(f"Spark read a file the statement did not ask for: {uri}")


def _rewritten_rows(
    spark: SparkSession,
    schema: StructType,
    meta: TableMeta,
    files: Sequence[FileEntry],
    predicate: str | None,
    updates: Mapping[str, str],
) -> DataFrame:
    """The rows that replace ``files``: those not matching for a delete, every row with
    the matching ones changed for an update (expressions see the row before it)."""
    rows = read_version(spark, schema, meta.partition_by, meta.location, files)
    matches = matching(predicate)
    if not updates:
        return rows.filter(f"NOT {matches}")
    columns = []
    for name in schema.fieldNames():
        if name in updates:
            kind = schema[name].dataType.simpleString()
            columns.append(
                f"CASE WHEN {matches} THEN CAST(({updates[name]}) AS {kind}) "
                f"ELSE {quote(name)} END AS {quote(name)}"
            )
        else:
            columns.append(quote(name))
    return rows.selectExpr(*columns)


def _changed_rows(
    spark: SparkSession,
    schema: StructType,
    meta: TableMeta,
    files: Sequence[FileEntry],
    predicate: str | None,
    updates: Mapping[str, str],
) -> DataFrame:
    """The statement's change feed rows: each deleted row, or each updated row's pre-
    and post-image, with ``_change_type`` (never the rows a rewrite only copies)."""
    matched = read_version(spark, schema, meta.partition_by, meta.location, files).filter(
        matching(predicate)
    )
    if not updates:
        return tagged(matched, schema, DELETE_ROW)
    after = matched.selectExpr(
        *[
            cast_to_column(schema, name, updates[name]) if name in updates else quote(name)
            for name in schema.fieldNames()
        ]
    )
    before = tagged(matched, schema, UPDATE_PREIMAGE)
    return before.unionByName(tagged(after, schema, UPDATE_POSTIMAGE))
