"""``MERGE`` in Arrow on the driver: the fast path of ``merge``, when it is safe.

The Spark path (``merge``) joins the candidate files with the source in a Spark job,
then reads and joins the files it rewrites again in a second one. For the common
statement (an equi-join on keys, clauses without predicates, a source that fits in
the driver) the same result needs neither: this module collects the source once as
an Arrow table and does every step with pyarrow, in the driver process, through the
same file-system layer as the data source (``datasource.files``: local and S3):

1. **Which statements** (:func:`arrow_merge`): the ``ON`` condition is a conjunction
   of ``target.k = source.c`` (keys of integer, string or date columns, the same kind
   on both sides) and conditions on target partition columns alone (``target.p =
   0``: decided exactly by each file's partition values, so pruning applies them);
   the clauses are ``update`` (every column, or columns set from a source or target
   column), ``delete``, ``insert`` (every column, or columns from source columns), none
   with a predicate, no ``not matched by source``; values keep their type or widen
   (integers, float to double); the table's columns are of kinds pyarrow and Spark
   store alike. Anything else is the Spark path's, and the reason is logged (debug).
2. **Source** (:func:`_collect`): the columns the statement uses, at most
   :data:`MAX_SOURCE_ROWS` rows and :data:`MAX_SOURCE_BYTES`, else the Spark path.
3. **Prune**: the very conditions the Spark path computes (``merge.range_conditions``,
   ``merge.partition_conditions``, ``merge.alternatives``), from the Arrow source.
4. **Find** (:func:`_find`): the key columns of the candidate files only, one hash join
   with the source keys (SQL ``=``: a NULL key joins nothing). A target row joined by
   several source rows fails the statement with the Spark path's error (unless the
   only matched clause is an unconditional delete), before anything is written.
5. **Rewrite and commit**: each file holding a matched row is read whole and written
   again with those rows updated in place or left out; the inserts (source rows no
   target row joined) and the change rows (pre-images, deletes, post-images and
   inserts, as the Spark path writes them for ``changes``) are written beside them,
   all by ``datasource.files.write_batches`` (its file names, statistics and
   ``FileEntry`` shapes; ``write_table``, the same files, for an unpartitioned table),
   and committed by ``dml.commit_rewrite`` with the Spark path's read set (files
   rewritten, files joined but kept, the conditions).

**One pass** (:class:`_OnePass`): when the statement changes matched rows, joins
on one stored column and no two source rows share a key, no target row can be joined
twice, so nothing has to be refused before writing: steps 4 and 5 become one pass
over the candidate files, each opened once (one footer read): its key column looked
up in the source keys (:class:`_SourceKeys`), and only a file a source row joined has
its other columns read and is rewritten. The read set is the same.

Files are read and written by :data:`FILE_WORKERS` threads (pyarrow releases the GIL).
The result and the committed table are the Spark path's; only the number of files
the rewrite leaves may differ (Spark packs small files into one task's output).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from spark_integration.engine.model import MERGE, DmlResult, FileEntry
from spark_integration.engine.read_set import ReadSet, widen
from spark_integration.spark import changes, dml, filesystem, merge
from spark_integration.spark.datasource.batch_read import files_to_read
from spark_integration.spark.datasource.files import (
    FileToRead,
    _constant,
    write_batches,
    write_table,
)
from spark_integration.spark.hook import Job
from spark_integration.spark.schema import quote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: At most this many source rows are collected to the driver. The join's hash table
#: and the source are held in memory while every candidate file is read: 1M rows of
#: a few columns is tens of MB, and a source this large is rare for a MERGE; a larger
#: one is left to Spark, whose join spills and spreads over executors.
MAX_SOURCE_ROWS = 1_000_000
#: ... and at most this many bytes of them (wide rows: the same memory bound).
MAX_SOURCE_BYTES = 256 << 20
#: Threads reading and writing files: pyarrow's work runs outside the GIL, and the
#: machines this runs on have few cores; more would only hold more files in memory.
FILE_WORKERS = 2
#: String keys are looked up in a file by hashing the source's keys again for each
#: candidate file (``pc.index_in``): past this many source rows a MERGE on a string
#: key takes the two steps (one hash join of every candidate file's keys) instead.
ONE_PASS_STRING_KEYS = 10_000
#: A column stays dictionary-encoded when its dictionary page is less than this
#: share (1 / DICTIONARY_SHARE) of its column chunk (see ``_dictionary_columns``).
DICTIONARY_SHARE = 4
#: Internal columns of the join (``_lh_``: never a table column).
_T, _S = "_lh_merge_target_row", "_lh_merge_source_row"
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_IDENT = r"(?:`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*))"
_VALUE = re.compile(rf"\s*(?:{_IDENT}\s*\.\s*)?{_IDENT}\s*")
_EQUI = re.compile(rf"\s*{_IDENT}\s*\.\s*{_IDENT}\s*==?\s*{_IDENT}\s*\.\s*{_IDENT}\s*")


@dataclass(slots=True)
class _Switch:
    """Tests only (``spark.testing``): force the Spark path, and record which path ran."""

    spark_only: bool = False
    taken: list[str] | None = None

    def took(self, path: str) -> None:
        if self.taken is not None:
            self.taken.append(path)


SWITCH = _Switch()


@contextmanager
def paths_taken(*, spark_only: bool) -> Iterator[list[str]]:
    """While inside: ``spark_only`` forces the Spark path; yields the path each MERGE
    took, in order (``"arrow"`` or ``"spark"``). Used by ``spark.testing`` only."""
    before = (SWITCH.spark_only, SWITCH.taken)
    SWITCH.spark_only, SWITCH.taken = spark_only, []
    try:
        yield SWITCH.taken
    finally:
        SWITCH.spark_only, SWITCH.taken = before


@dataclass(frozen=True, slots=True)
class ArrowMerge:
    """A statement the Arrow path runs. ``keys``: (target column, source column) pairs
    of the join. ``matched``: the kind of the first matched clause (it acts on every
    matched row), ``None`` without one; ``updates``: for an update, target column ->
    (``"source"`` or ``"target"``, column). ``inserts``: target column -> source
    column of the first insert clause, ``None`` without one."""

    keys: tuple[tuple[str, str], ...]
    matched: str | None
    updates: Mapping[str, tuple[str, str]]
    inserts: Mapping[str, str] | None
    source_columns: tuple[str, ...] = field(default=())


def execute(m: merge.MergeBuilder, plan: merge.Plan) -> DmlResult | None:
    """Run the checked statement in Arrow; ``None`` when it is the Spark path's."""
    chosen = arrow_merge(plan, m.source.schema)
    source = None if isinstance(chosen, str) else _collect(m.source, chosen)
    if isinstance(chosen, str) or source is None:
        why = chosen if isinstance(chosen, str) else "the source is too large to collect"
        log.debug("%s: the Spark path: %s", plan.what, why)
        SWITCH.took("spark")
        return None
    SWITCH.took("arrow")
    return _Run(m, plan, chosen, source).execute()


def arrow_merge(plan: merge.Plan, source: StructType) -> ArrowMerge | str:
    """The statement as the Arrow path runs it, or why it cannot (a sentence)."""
    if SWITCH.spark_only:
        return "switched off for a test"
    for clause in plan.clauses:
        if clause.predicate is not None:
            return f"a {clause.kind} clause has a predicate"
        if clause.kind == merge.DELETE_BY_SOURCE:
            return "a not matched by source clause"
    for f in plan.schema.fields:
        if not _supported(f.dataType):
            return f"column {f.name!r} is of type {f.dataType.simpleString()}"
    names = [f.name.lower() for f in source.fields]
    if len(set(names)) != len(names):
        return "the source has two columns of one name"
    keys = _keys(plan, source)
    if isinstance(keys, str):
        return keys
    target_types = {f.name: f.dataType for f in plan.schema.fields}
    source_types = {f.name.lower(): f for f in source.fields}
    matched = plan.of(merge.UPDATE, merge.DELETE)
    updates: dict[str, tuple[str, str]] = {}
    if matched and matched[0][1].kind == merge.UPDATE:
        for column, expression in (matched[0][1].updates or {}).items():
            value = _value(plan, source, expression, insert=False)
            if value is None:
                return f"the update of {column!r} is not a column ({expression!r})"
            side, name = value
            kind = source_types[name.lower()].dataType if side == "source" else target_types[name]
            if side == "source":
                name = source_types[name.lower()].name
            if not _widens(kind, target_types[column]):
                return f"{column!r} would be set from a {kind.simpleString()}"
            updates[column] = (side, name)
    inserting = plan.of(merge.INSERT)
    inserts: dict[str, str] | None = None
    if inserting:
        inserts = {}
        for column, expression in (inserting[0][1].updates or {}).items():
            value = _value(plan, source, expression, insert=True)
            if value is None:
                return f"the insert of {column!r} is not a source column ({expression!r})"
            found = source_types[value[1].lower()]
            if not _widens(found.dataType, target_types[column]):
                return f"{column!r} would be inserted from a {found.dataType.simpleString()}"
            inserts[column] = found.name
    used = [s for _, s in keys]
    used += [c for side, c in updates.values() if side == "source"]
    used += list((inserts or {}).values())
    return ArrowMerge(
        keys,
        matched[0][1].kind if matched else None,
        updates,
        inserts,
        tuple(dict.fromkeys(used)),
    )


def _supported(kind: DataType) -> bool:
    """Types Spark's and pyarrow's Parquet agree on, compared and cast alike."""
    if isinstance(kind, StringType):
        return getattr(kind, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(kind, (*_INTEGERS, FloatType, DoubleType, BooleanType, DateType))


def _widens(have: DataType, want: DataType) -> bool:
    """Whether Spark's ``CAST(value AS want)`` keeps every value of ``have`` as it is."""
    if not _supported(have):
        return False
    if type(have) is type(want):
        return True
    if isinstance(have, _INTEGERS) and isinstance(want, _INTEGERS):
        return _INTEGERS.index(type(have)) < _INTEGERS.index(type(want))
    return isinstance(have, FloatType) and isinstance(want, DoubleType)


def _name(quoted: str | None, plain: str | None) -> str:
    return quoted if quoted is not None else str(plain)


def _keys(plan: merge.Plan, source: StructType) -> tuple[tuple[str, str], ...] | str:
    """The join's key pairs, if every conjunct of ``ON`` is a key pair or a condition on
    a target partition column alone."""
    conjuncts = dml.conjuncts_of(plan.predicate)
    if conjuncts is None:
        return "the merge predicate's conjuncts cannot be told apart"
    kinds = dml.column_kinds(plan.schema)
    of_source = {f.name.lower(): f for f in source.fields}
    sides = {plan.t.lower(): "target", plan.s.lower(): "source"}
    keys: list[tuple[str, str]] = []
    for text in conjuncts:
        match = _EQUI.fullmatch(text)
        if match is not None:
            g = match.groups()
            a1, c1, a2, c2 = (
                _name(g[0], g[1]),
                _name(g[2], g[3]),
                _name(g[4], g[5]),
                _name(g[6], g[7]),
            )
            pair = {sides.get(a1.lower()): c1, sides.get(a2.lower()): c2}
            t, s = pair.get("target"), pair.get("source")
            if t is None or s is None or t.lower() not in kinds or s.lower() not in of_source:
                return f"the conjunct {text.strip()!r} does not join target to source"
            name, kind = kinds[t.lower()]
            if (
                kind not in ("int", "str", "date")
                or dml.value_kind(of_source[s.lower()].dataType) != kind
            ):
                return f"the key {text.strip()!r} compares columns of different kinds"
            keys.append((name, of_source[s.lower()].name))
            continue
        found = merge.target_conditions(text, plan.schema, plan.t, source.fieldNames())
        if len(found) != 1 or found[0].column not in plan.meta.partition_by:
            return f"the conjunct {text.strip()!r} is neither a key nor a partition condition"
    if not keys:
        return "the merge predicate joins no target column to a source column"
    return tuple(keys)


def _value(
    plan: merge.Plan, source: StructType, expression: str, *, insert: bool
) -> tuple[str, str] | None:
    """``(side, column)`` when ``expression`` is one column (``alias.col`` or ``col``)."""
    match = _VALUE.fullmatch(expression)
    if match is None:
        return None
    g = match.groups()
    alias = None if g[0] is None and g[1] is None else _name(g[0], g[1])
    column = _name(g[2], g[3])
    in_source = column.lower() in {c.lower() for c in source.fieldNames()}
    in_target = column.lower() in dml.column_kinds(plan.schema)
    if alias is None:
        if insert or (in_source and not in_target):
            side = "source"
        elif in_target and not in_source:
            side = "target"
        else:
            return None
    elif alias.lower() == plan.s.lower():
        side = "source"
    elif alias.lower() == plan.t.lower() and not insert:
        side = "target"
    else:
        return None
    if side == "source" and not in_source:
        return None
    if side == "target":
        if not in_target:
            return None
        column = dml.column_kinds(plan.schema)[column.lower()][0]
    return side, column


def _collect(df: DataFrame, chosen: ArrowMerge) -> pa.Table | None:
    """The source's used columns as one Arrow table; ``None`` past the bounds."""
    # A source of just the used columns, in order, is collected as it is: a select is
    # a round trip to the JVM (and the statement's first analysis of the source).
    same = list(chosen.source_columns) == df.columns
    used = df if same else df.select(*[quote(c) for c in chosen.source_columns])
    table = used.limit(MAX_SOURCE_ROWS + 1).toArrow()
    if table.num_rows > MAX_SOURCE_ROWS or table.nbytes > MAX_SOURCE_BYTES:
        return None
    return table


# --- the statement --------------------------------------------------------------------


@dataclass(slots=True)
class _FileMatch:
    """One file's matched rows: target row numbers (ascending, each once) and, for
    each, the source row joined to it."""

    entry: FileEntry
    target_rows: np.ndarray[Any, Any]
    source_rows: np.ndarray[Any, Any]


@dataclass(slots=True)
class _Rewritten:
    data: list[FileEntry]
    changed: list[pa.Table]
    dictionary: list[str]  # the columns its data files dictionary-encode


class _Run:
    """One statement in Arrow: :meth:`execute` runs the steps of the module docstring."""

    def __init__(
        self, m: merge.MergeBuilder, plan: merge.Plan, chosen: ArrowMerge, source: pa.Table
    ) -> None:
        self.m, self.plan, self.chosen, self.source = m, plan, chosen, source
        self.target = _nullable(to_arrow_schema(plan.schema, timezone="UTC"))
        self.columns = tuple(plan.schema.fieldNames())
        self.partition_by = plan.meta.partition_by
        self.entries: list[FileEntry] = []  # the table's files at the version read

    def execute(self) -> DmlResult:
        plan, m = self.plan, self.m
        _, _, entries = m.catalog.files(m.table, plan.version, FileEntry)
        self.entries = entries
        alternatives = self._alternatives()
        candidates = [
            e for e in entries if any(ReadSet(0, (), alt).may_match(e) for alt in alternatives)
        ]
        keys = self._unique_keys()
        if keys is not None:
            return _OnePass(self, keys).execute(candidates, alternatives)
        matches, joined_sources = self._find(candidates)
        # A matched clause changes every matched row: each file a match found is
        # rewritten; without one (insert only) those files are read and kept.
        touched = matches if self.chosen.matched is not None else []
        kept = [f.entry for f in matches] if self.chosen.matched is None else []
        changed = sum(len(f.target_rows) for f in touched)
        inserts = self._inserts(joined_sources)
        log.info(
            "%s (Arrow): %d of %d files may hold rows it reads, %d hold rows it changes "
            "(version %d)",
            plan.what,
            len(candidates),
            len(entries),
            len(touched),
            plan.version,
        )
        read_set = ReadSet(
            plan.version,
            tuple(f.entry.path for f in touched),
            widen(alternatives),
            tuple(e.path for e in kept),
        )

        def write(job: Job) -> tuple[list[FileEntry], list[FileEntry]]:
            return self._write(job, touched, inserts)

        version, written = dml.commit_rewrite(
            m.catalog, MERGE, plan.meta, plan.schema, write, read_set
        )
        deleted = changed if self.chosen.matched == merge.DELETE else 0
        return DmlResult(
            version,
            rows_inserted=inserts.num_rows if written else 0,
            rows_updated=changed if self.chosen.matched == merge.UPDATE else 0,
            rows_deleted=deleted,
            files_added=len(written),
            files_removed=len(touched),
        )

    def _alternatives(self) -> list[tuple[Any, ...]]:
        """The Spark path's conditions, from the Arrow source."""
        plan, source = self.plan, self.source
        schema = self.m.source.schema
        pairs = merge.range_pairs(plan, schema)
        bounds = []
        for column in pairs.values():
            low_high = pc.min_max(source.column(column))
            bounds.append((low_high["min"].as_py(), low_high["max"].as_py()))
        ranges = merge.range_conditions(plan, pairs, bounds)
        by_partition = merge.partition_pairs(
            plan.predicate, plan.meta.partition_by, plan.t, plan.s, schema.fieldNames()
        )
        partitions: list[Any] | None = []
        if ranges is not None and by_partition:
            columns = list(dict.fromkeys(by_partition.values()))
            distinct = source.select(columns).group_by(columns).aggregate([])
            found = distinct.slice(0, merge.MAX_PARTITION_VALUES + 1).to_pylist()
            partitions = merge.partition_conditions(plan, by_partition, found)
        return merge.alternatives(plan, schema.fieldNames(), ranges, partitions)

    @contextmanager
    def _open(self, entry: FileEntry) -> Iterator[tuple[pq.ParquetFile, FileToRead]]:
        """``entry``'s file, open: its footer is read once, here, for every read of it."""
        (item,) = files_to_read(self.plan.meta.location, [entry])
        fs, fs_path = filesystem.resolve(item.path)
        with fs.open_input_file(fs_path) as stream:
            # pre_buffer: one ranged GET per run of column chunks, not one per page.
            yield pq.ParquetFile(stream, pre_buffer=True), item

    def _columns(
        self, parquet: pq.ParquetFile, item: FileToRead, columns: Sequence[str]
    ) -> dict[str, Any]:
        """``columns`` of the open file, as ``datasource.files.read_files`` reads them:
        cast to the table's types, partition columns from the file's partition values, a
        column the file lacks as NULL."""
        present = set(parquet.schema_arrow.names)
        data = [c for c in columns if c not in self.partition_by and c in present]
        table = parquet.read(columns=data)
        rows = parquet.metadata.num_rows
        out = {}
        for name in columns:
            kind = self.target.field(name).type
            if name in self.partition_by:
                out[name] = _constant(item.partition.get(name), kind, rows)
            elif name in present:
                out[name] = table.column(name).cast(kind)
            else:
                out[name] = pa.nulls(rows, kind)
        return out

    def _read(self, entry: FileEntry, columns: Sequence[str] | None = None) -> pa.Table:
        """``entry``'s rows, of the table's columns (or of ``columns``)."""
        names = self.columns if columns is None else columns
        with self._open(entry) as (parquet, item):
            found = self._columns(parquet, item, names)
        schema = pa.schema([self.target.field(c) for c in names])
        return pa.table([found[c] for c in names], schema=schema)

    def _find(
        self, candidates: Sequence[FileEntry]
    ) -> tuple[list[_FileMatch], np.ndarray[Any, Any]]:
        """The files holding rows that joined a source row, with those rows, and which
        source rows joined any; raises the Spark path's error for a target row that
        several source rows would change."""
        if not candidates:
            return [], np.zeros(self.source.num_rows, dtype=bool)
        target_keys = [t for t, _ in self.chosen.keys]
        with ThreadPoolExecutor(FILE_WORKERS) as pool:
            tables = list(pool.map(lambda e: self._read(e, target_keys), candidates))
        offsets = np.cumsum([0] + [t.num_rows for t in tables])
        keys = pa.concat_tables(tables)
        left = pa.table(
            {
                **{f"k{i}": _key(keys.column(c)) for i, c in enumerate(target_keys)},
                _T: pa.array(np.arange(offsets[-1], dtype=np.int64)),
            }
        )
        right = pa.table(
            {
                **{
                    f"k{i}": _key(self.source.column(s))
                    for i, (_, s) in enumerate(self.chosen.keys)
                },
                _S: pa.array(np.arange(self.source.num_rows, dtype=np.int64)),
            }
        )
        names = [f"k{i}" for i in range(len(target_keys))]
        pairs = left.join(right, names, join_type="inner", use_threads=True).select([_T, _S])
        pairs = pairs.sort_by(_T)
        t_rows = pairs.column(_T).to_numpy()
        s_rows = pairs.column(_S).to_numpy()
        joined_sources = np.zeros(self.source.num_rows, dtype=bool)
        joined_sources[s_rows] = True
        first = np.ones(len(t_rows), dtype=bool)
        first[1:] = t_rows[1:] != t_rows[:-1]
        if not first.all() and self.chosen.matched is not None:
            self._refuse(t_rows, first, candidates, offsets)
        t_rows, s_rows = t_rows[first], s_rows[first]
        bounds = np.searchsorted(t_rows, offsets)
        out = []
        for i, entry in enumerate(candidates):
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                out.append(_FileMatch(entry, t_rows[lo:hi] - offsets[i], s_rows[lo:hi]))
        return out, joined_sources

    def _refuse(
        self,
        t_rows: np.ndarray[Any, Any],
        first: np.ndarray[Any, Any],
        candidates: Sequence[FileEntry],
        offsets: np.ndarray[Any, Any],
    ) -> None:
        """The Spark path's error for the target row joined by the most source rows."""
        if merge.only_unconditional_delete(self.plan):
            return
        starts = np.flatnonzero(first)
        runs = np.diff(np.append(starts, len(t_rows)))
        worst = int(np.argmax(runs))
        row = int(t_rows[starts[worst]])
        i = int(np.searchsorted(offsets, row, side="right") - 1)
        values = self._read(candidates[i]).slice(row - int(offsets[i]), 1).to_pylist()[0]
        sample = json.dumps(
            {k: v for k, v in values.items() if v is not None},
            separators=(",", ":"),
            default=str,
            ensure_ascii=False,
        )
        raise merge.ambiguous_match(self.plan, int(runs[worst]), sample)

    def _inserts(self, joined_sources: np.ndarray[Any, Any]) -> pa.Table:
        """The rows the insert clause adds: source rows no target row joined."""
        if self.chosen.inserts is None:
            return self.target.empty_table()
        rows = self.source.filter(pa.array(~joined_sources))
        return pa.table(
            [
                _cast(rows.column(self.chosen.inserts[f.name]), f.type)
                if f.name in self.chosen.inserts
                else pa.nulls(rows.num_rows, f.type)
                for f in self.target
            ],
            schema=self.target,
        )

    def _rewrite(self, job: Job, match: _FileMatch, tag: str) -> _Rewritten:
        """``match``'s file written again, its matched rows updated or left out."""
        with self._open(match.entry) as (parquet, item):
            found = self._columns(parquet, item, self.columns)
            dictionary = _dictionary_columns(parquet.metadata)
        table = pa.table([found[c] for c in self.columns], schema=self.target)
        return self._rewritten(job, match, table, dictionary, tag)

    def _rewritten(
        self, job: Job, match: _FileMatch, table: pa.Table, dictionary: list[str], tag: str
    ) -> _Rewritten:
        """``table`` (``match``'s file's rows) written again, its matched rows updated or
        left out; with the change rows."""
        table = table.combine_chunks()
        mask = np.zeros(table.num_rows, dtype=bool)
        mask[match.target_rows] = True
        before = table.take(pa.array(match.target_rows))
        if self.chosen.matched == merge.DELETE:
            rows = table.filter(pa.array(~mask))
            deleted = [_tagged(before, changes.DELETE_ROW)]
            return _Rewritten(
                self._files(job, rows, tag, dictionary=dictionary), deleted, dictionary
            )
        after = self._updated(before, match.source_rows)
        arrow_mask = pa.array(mask)
        rows = pa.table(
            [
                pc.replace_with_mask(
                    table.column(f.name).chunk(0), arrow_mask, after.column(f.name).combine_chunks()
                )
                if f.name in self.chosen.updates and table.num_rows
                else table.column(f.name)
                for f in self.target
            ],
            schema=self.target,
        )
        change_rows = [
            _tagged(before, changes.UPDATE_PREIMAGE),
            _tagged(after, changes.UPDATE_POSTIMAGE),
        ]
        return _Rewritten(
            self._files(job, rows, tag, dictionary=dictionary), change_rows, dictionary
        )

    def _updated(self, before: pa.Table, source_rows: np.ndarray[Any, Any]) -> pa.Table:
        """``before`` (matched target rows) as the update clause sets them."""
        taken = self.source.take(pa.array(source_rows))
        columns = []
        for f in self.target:
            side, column = self.chosen.updates.get(f.name, ("target", f.name))
            values = taken.column(column) if side == "source" else before.column(column)
            columns.append(_cast(values, f.type))
        return pa.table(columns, schema=self.target)

    def _files(
        self,
        job: Job,
        rows: pa.Table,
        tag: str,
        columns: Sequence[str] | None = None,
        dictionary: Sequence[str] | None = None,
    ) -> list[FileEntry]:
        if not self.partition_by:  # one file of one in-memory table: no dataset writer
            return write_table(
                rows,
                location=job.location,
                staging=job.staging,
                columns=columns or self.columns,
                tag=tag,
                dictionary=dictionary,
            )
        return write_batches(
            iter(rows.to_batches()),
            location=job.location,
            staging=job.staging,
            columns=columns or self.columns,
            partition_by=self.partition_by,
            tag=tag,
            dictionary=dictionary,
        )

    def _write(
        self, job: Job, touched: Sequence[_FileMatch], inserts: pa.Table
    ) -> tuple[list[FileEntry], list[FileEntry]]:
        """Every new file of the statement, in ``job``: (data files, change files)."""
        with ThreadPoolExecutor(FILE_WORKERS) as pool:
            rewritten = list(
                pool.map(
                    lambda i_match: self._rewrite(job, i_match[1], f"{i_match[0]:05d}-0"),
                    enumerate(touched),
                )
            )
        return self._write_rest(job, rewritten, inserts, f"{len(touched):05d}-0")

    def _write_rest(
        self, job: Job, rewritten: Sequence[_Rewritten], inserts: pa.Table, tag: str
    ) -> tuple[list[FileEntry], list[FileEntry]]:
        """The files rewritten, with the inserts (file tag ``tag``) and the change rows
        written beside them: (data files, change files)."""
        # New rows are encoded as the first rewritten file's (else pyarrow's default).
        dictionary = rewritten[0].dictionary if rewritten else None
        data = [e for r in rewritten for e in r.data]
        data += self._files(job, inserts, tag, dictionary=dictionary)
        changed = [t for r in rewritten for t in r.changed]
        changed.append(_tagged(inserts, changes.INSERT))
        change_rows = pa.concat_tables(changed)
        change_columns = (*self.columns, changes.CHANGE_TYPE)
        change_tag = f"{changes.CHANGE_FILE_TAG}00000-0"
        kept = None if dictionary is None else [*dictionary, changes.CHANGE_TYPE]
        return data, self._files(job, change_rows, change_tag, change_columns, kept)

    # --- one pass: find and rewrite each file as it is read ---------------------------

    def _unique_keys(self) -> _SourceKeys | None:
        """The source's join keys, when one pass over the candidate files can both find
        the matched rows and rewrite them (:class:`_OnePass`): the statement changes
        matched rows, joins on one column the files store (not a partition column), and
        no two source rows share a key, so no target row is joined twice (there is
        nothing to refuse before writing); string keys only from a source of at most
        :data:`ONE_PASS_STRING_KEYS` rows. ``None`` otherwise."""
        if self.chosen.matched is None or len(self.chosen.keys) != 1:
            return None
        ((target, source),) = self.chosen.keys
        if target in self.partition_by:
            return None
        keys = _key(self.source.column(source))
        if pa.types.is_string(keys.type) and len(keys) > ONE_PASS_STRING_KEYS:
            return None
        valid = len(keys) - keys.null_count
        if pc.count_distinct(keys, mode="only_valid").as_py() != valid:
            return None
        return _SourceKeys.of(keys)


class _OnePass:
    """The statement in one pass over the candidate files (:meth:`_Run._unique_keys`
    says when): each file opened once, its key column looked up in the source keys,
    and only a file a source row joined read whole and rewritten."""

    def __init__(self, run: _Run, keys: _SourceKeys) -> None:
        self.run, self.keys = run, keys

    def execute(
        self, candidates: Sequence[FileEntry], alternatives: list[tuple[Any, ...]]
    ) -> DmlResult:
        """The statement with each candidate file opened once (:meth:`_merge_file`):
        the same files, rows, change rows and read set as :meth:`_Run.execute`'s two
        steps, which read every candidate's keys first, then each touched file again."""
        run = self.run
        plan, m = run.plan, run.m
        touched: list[FileEntry] = []
        changed = [0]
        inserts = [run.target.empty_table()]

        def write(job: Job) -> tuple[list[FileEntry], list[FileEntry]]:
            with ThreadPoolExecutor(FILE_WORKERS) as pool:
                merged = list(
                    pool.map(
                        lambda i_e: self._merge_file(job, i_e[1], f"{i_e[0]:05d}-0"),
                        enumerate(candidates),
                    )
                )
            joined_sources = np.zeros(run.source.num_rows, dtype=bool)
            rewritten = []
            for entry, found in zip(candidates, merged, strict=True):
                if found is not None:
                    touched.append(entry)
                    rewritten.append(found[0])
                    joined_sources[found[1]] = True
                    changed[0] += len(found[1])
            inserts[0] = run._inserts(joined_sources)
            log.info(
                "%s (Arrow, one pass): %d of %d files may hold rows it reads, %d hold rows "
                "it changes (version %d)",
                plan.what,
                len(candidates),
                len(run.entries),
                len(touched),
                plan.version,
            )
            return run._write_rest(job, rewritten, inserts[0], f"{len(candidates):05d}-0")

        def read_set(_: list[FileEntry]) -> ReadSet:
            return ReadSet(plan.version, tuple(e.path for e in touched), widen(alternatives), ())

        version, written = dml.commit_rewrite(
            m.catalog, MERGE, plan.meta, plan.schema, write, read_set
        )
        return DmlResult(
            version,
            rows_inserted=inserts[0].num_rows if written else 0,
            rows_updated=changed[0] if run.chosen.matched == merge.UPDATE else 0,
            rows_deleted=changed[0] if run.chosen.matched == merge.DELETE else 0,
            files_added=len(written),
            files_removed=len(touched),
        )

    def _merge_file(
        self, job: Job, entry: FileEntry, tag: str
    ) -> tuple[_Rewritten, np.ndarray[Any, Any]] | None:
        """One candidate file, its footer read once: its key column looked up in the
        source's ``keys`` (SQL ``=``: a NULL key joins nothing); with a match, its other
        columns read and the file rewritten (:meth:`_Run._rewritten`). Returns that and the
        source rows joined, or ``None``: no row joined, the file is kept (and its other
        columns never read)."""
        run = self.run
        key = run.chosen.keys[0][0]
        with run._open(entry) as (parquet, item):
            found = run._columns(parquet, item, [key])
            target_rows, source_rows = self.keys.lookup(_key(found[key]))
            if not len(target_rows):
                return None
            found.update(run._columns(parquet, item, [c for c in run.columns if c != key]))
            dictionary = _dictionary_columns(parquet.metadata)
        table = pa.table([found[c] for c in run.columns], schema=run.target)
        match = _FileMatch(entry, target_rows, source_rows)
        return run._rewritten(job, match, table, dictionary, tag), source_rows


@dataclass(frozen=True, slots=True)
class _SourceKeys:
    """The source's join keys (no two non-null ones equal), ready for looking up each
    file's keys in: integer and date keys sorted once, as ``int64`` (a binary search
    per file, outside the GIL); string keys as they are (``pc.index_in``, which hashes
    them again for each file: :data:`ONE_PASS_STRING_KEYS` bounds that)."""

    keys: pa.Array
    sorted: np.ndarray[Any, Any] | None = None  # the non-null keys, ascending
    rows: np.ndarray[Any, Any] | None = None  # the source row of each

    @classmethod
    def of(cls, keys: pa.Array) -> _SourceKeys:
        if pa.types.is_string(keys.type):
            return cls(keys)
        rows = np.flatnonzero(keys.is_valid().to_numpy(zero_copy_only=False))
        values = _integers(keys)[rows]
        order = np.argsort(values, kind="stable")
        return cls(keys, values[order], rows[order])

    def lookup(self, keys: pa.Array) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The rows of ``keys`` (a file's, ascending) equal to a source key, and the
        source row each equals (SQL ``=``: a NULL key equals nothing)."""
        if self.sorted is None or self.rows is None:
            index = pc.index_in(keys, value_set=self.keys, skip_nulls=True)
            joined = np.flatnonzero(index.is_valid().to_numpy(zero_copy_only=False))
            return joined, index.drop_null().to_numpy().astype(np.int64)
        values = _integers(keys)
        if not len(self.sorted):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        at = np.searchsorted(self.sorted, values)
        at[at == len(self.sorted)] = 0
        equal = self.sorted[at] == values
        if keys.null_count:
            equal &= keys.is_valid().to_numpy(zero_copy_only=False)
        joined = np.flatnonzero(equal)
        return joined, self.rows[at[joined]]


def _integers(values: pa.Array) -> np.ndarray[Any, Any]:
    """Integer or date keys as ``int64`` (a NULL as 0: callers mask them)."""
    if pa.types.is_date32(values.type):
        values = values.view(pa.int32())
    return np.asarray(values.cast(pa.int64()).fill_null(0).to_numpy())


def _dictionary_columns(footer: pq.FileMetaData) -> list[str]:
    """The columns a rewrite of a file dictionary-encodes: those whose
    dictionary is small beside their data in the file's first row group (few distinct
    values). Where it is not, pyarrow's writer builds a dictionary of nearly every value
    only to give up on it (past its page size limit) or to gain nothing: most of the
    cost of writing unique keys, strings and doubles (5x, measured on the MERGE
    benchmark's files), for no smaller file. ``footer``: the file's Parquet footer."""
    if footer.num_row_groups == 0:
        return []
    group = footer.row_group(0)
    out = []
    for j in range(group.num_columns):
        chunk = group.column(j)
        if not chunk.has_dictionary_page or chunk.dictionary_page_offset is None:
            continue
        dictionary_bytes = chunk.data_page_offset - chunk.dictionary_page_offset
        if dictionary_bytes * DICTIONARY_SHARE < chunk.total_compressed_size:
            out.append(chunk.path_in_schema)
    return out


def _nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable, as the Spark path's written files have."""
    return pa.schema([f.with_nullable(True) for f in schema])


def _key(values: Any) -> Any:
    """A key column in the type both sides of the join compare in."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if pa.types.is_integer(values.type):
        return values.cast(pa.int64())
    if pa.types.is_large_string(values.type):
        return values.cast(pa.string())
    return values


def _cast(values: Any, kind: pa.DataType) -> Any:
    """``values`` as the column's type (only widening casts come here: exact)."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return values if values.type == kind else values.cast(kind)


def _tagged(rows: pa.Table, change_type: str) -> pa.Table:
    return rows.append_column(
        pa.field(changes.CHANGE_TYPE, pa.string()),
        pa.array([change_type] * rows.num_rows, pa.string()),
    )
