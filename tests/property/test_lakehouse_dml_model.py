"""Row-level statements and overwrites by predicate, checked against a pandas model.

Hypothesis runs random sequences of appends, whole-table overwrites, ``replaceWhere``
and dynamic partition overwrites, ``DELETE``, ``UPDATE``, ``MERGE`` (every clause kind
of the builder), schema changes (``add_columns``, an append that brings a new column
with ``merge_schema``, an overwrite whose schema replaces the table's with
``overwrite_schema``: extras dropped, added, columns reordered) and compaction
(``optimize``) on a small table partitioned by ``day``, with few distinct values (so
predicates both hit and miss) and NULLs (so SQL's three-valued logic matters). The
model keeps one pandas frame per version, computed from the statement's meaning alone:
predicates and expressions are built as small trees (:class:`Expr`) that render to
Spark SQL and evaluate in Python with SQL's NULL rules.

After every step:

* the table at **every** version so far holds exactly the model's rows and columns
  for that version (sorted: the order of rows is not part of the contract): the new
  version read in full by time travel, the older ones by their files (each version's
  files and sizes as when it was read and found right; a version is its files), and
  at the end of each example every version read in full again, in one Spark job;
* compaction commits exactly when a partition in its scope holds several files,
  leaves one file there and changes no row;
* each statement returned the version the model expects (a statement that changes
  nothing commits nothing and returns the version it read) and the row counts of its
  ``DmlResult``; its file counts are the files the new version dropped and added;
* the change feed (``lh.changes``) between two random versions, and over every
  version at the end of each example, holds the model's change rows: exactly, for
  appends, whole overwrites and statements; for overwrites by predicate or of
  partitions (whose feed is every row of the files they removed and added), deletes
  that were rows before, inserts that are rows after, and the difference they make;
  compaction and ``add_columns`` none; the feed reads every version with the last
  one's columns, so a row shows the values it had of the columns still there (a
  column an ``overwrite_schema`` dropped and a later change added back shows the old
  values in the rows of versions before the drop: they are in those files);
* statements the model says must fail (a MERGE whose source matches one target row
  more than once for a clause that acts, a ``replaceWhere`` overwrite holding rows
  outside its predicate) raise ``ValueError`` and commit nothing.

It runs on an embedded lakehouse over SQLite and through one module gateway (the
``lh`` fixture of tests/integration/conftest.py). The default run is small (Spark
statements cost about a second each, more on a loaded machine);
``PERCOLAKE_LONG_PROPERTY`` runs many more and longer sequences (see ``LONG_EXAMPLES``).
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

pytest.importorskip("pyspark")

import pandas as pd
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
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from spark_integration import DmlResult, Lakehouse
from spark_integration.spark.testing import merge_paths
from tests.integration import conftest as shared

pytestmark = [pytest.mark.property, pytest.mark.spark]

#: The lakehouse statements' shared fixtures: ``lh`` (embedded, or a catalog of its own
#: on this module's one gateway, ``sqlite_gateway``).
lh = shared.lh
sqlite_gateway = shared.sqlite_gateway

#: ``PERCOLAKE_LONG_PROPERTY=1`` asks for a long run (100 examples of up to 12 steps),
#: ``=N`` for N examples; with ``-o timeout=0``, as it outlasts the per-test timeout.
_LONG = os.environ.get("PERCOLAKE_LONG_PROPERTY", "").strip()
LONG_EXAMPLES = (
    (int(_LONG) if _LONG.isdigit() and int(_LONG) > 1 else 100) if _LONG not in ("", "0") else 0
)

BASE = StructType(
    [
        StructField("id", IntegerType()),
        StructField("day", StringType()),
        StructField("amount", LongType()),
    ]
)
DAYS = ("d1", "d2", "d3")
#: Columns that schema changes add (``add_columns``, a ``merge_schema`` append: the
#: first one the table lacks) and drop (an ``overwrite_schema`` overwrite), INT, nullable.
EXTRAS = ("x1", "x2", "x3")
#: Columns of a numeric kind that predicates and updates compare with integers.
NUMERIC = {"id", "amount", *EXTRAS}

Row = dict[str, Any]
Value = int | str | None

# --- expressions: rendered to Spark SQL, evaluated with SQL's NULL rules ----------------


@dataclass(frozen=True)
class Col:
    name: str
    side: str | None = None  # "target"/"source" in a MERGE, None elsewhere

    def sql(self) -> str:
        return f"{self.side}.{self.name}" if self.side else self.name

    def eval(self, env: Callable[[Col], Value]) -> Value:
        return env(self)


@dataclass(frozen=True)
class Lit:
    value: Value

    def sql(self) -> str:
        if self.value is None:
            return "NULL"
        if isinstance(self.value, str):
            return f"'{self.value}'"
        return str(self.value)

    def eval(self, env: Callable[[Col], Value]) -> Value:
        return self.value


@dataclass(frozen=True)
class Add:
    left: Expr
    right: Expr

    def sql(self) -> str:
        return f"({self.left.sql()} + {self.right.sql()})"

    def eval(self, env: Callable[[Col], Value]) -> Value:
        a, b = self.left.eval(env), self.right.eval(env)
        if a is None or b is None:
            return None
        assert isinstance(a, int) and isinstance(b, int)
        return a + b


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "<>": lambda a, b: a != b,
}


@dataclass(frozen=True)
class Cmp:
    left: Expr
    op: str
    right: Expr

    def sql(self) -> str:
        return f"{self.left.sql()} {self.op} {self.right.sql()}"

    def eval(self, env: Callable[[Col], Value]) -> bool | None:
        a, b = self.left.eval(env), self.right.eval(env)
        return None if a is None or b is None else _OPS[self.op](a, b)


@dataclass(frozen=True)
class In:
    left: Expr
    values: tuple[int | str, ...]

    def sql(self) -> str:
        return f"{self.left.sql()} IN ({', '.join(Lit(v).sql() for v in self.values)})"

    def eval(self, env: Callable[[Col], Value]) -> bool | None:
        a = self.left.eval(env)
        return None if a is None else a in self.values


@dataclass(frozen=True)
class IsNull:
    left: Expr
    negated: bool = False

    def sql(self) -> str:
        return f"{self.left.sql()} IS {'NOT ' if self.negated else ''}NULL"

    def eval(self, env: Callable[[Col], Value]) -> bool:
        return (self.left.eval(env) is None) != self.negated


@dataclass(frozen=True)
class And:
    left: Pred
    right: Pred

    def sql(self) -> str:
        return f"({self.left.sql()}) AND ({self.right.sql()})"

    def eval(self, env: Callable[[Col], Value]) -> bool | None:
        a, b = self.left.eval(env), self.right.eval(env)
        if a is False or b is False:
            return False
        return None if a is None or b is None else True


@dataclass(frozen=True)
class Or:
    left: Pred
    right: Pred

    def sql(self) -> str:
        return f"({self.left.sql()}) OR ({self.right.sql()})"

    def eval(self, env: Callable[[Col], Value]) -> bool | None:
        a, b = self.left.eval(env), self.right.eval(env)
        if a is True or b is True:
            return True
        return None if a is None or b is None else False


@dataclass(frozen=True)
class Not:
    inner: Pred

    def sql(self) -> str:
        return f"NOT ({self.inner.sql()})"

    def eval(self, env: Callable[[Col], Value]) -> bool | None:
        a = self.inner.eval(env)
        return None if a is None else not a


Expr = Col | Lit | Add
Pred = Cmp | In | IsNull | And | Or | Not


def holds(pred: Pred | None, env: Callable[[Col], Value]) -> bool:
    """Whether a statement acts on the row: a NULL predicate does not (SQL WHERE)."""
    return pred is None or pred.eval(env) is True


def row_env(row: Row) -> Callable[[Col], Value]:
    return lambda c: row[c.name]


def pair_env(target: Row | None, source: Row | None) -> Callable[[Col], Value]:
    def env(c: Col) -> Value:
        side = target if c.side == "target" else source
        assert side is not None, f"{c.sql()} has no row here"
        return side[c.name]

    return env


# --- strategies -------------------------------------------------------------------------

INTS = st.integers(-2, 6)
DAY = st.sampled_from([*DAYS, None])


def rows_of(
    columns: Sequence[str], min_size: int = 0, max_size: int = 5
) -> st.SearchStrategy[list[Row]]:
    """Rows of the table's current columns, few distinct values, some NULLs."""
    kinds: dict[str, st.SearchStrategy[Value]] = {
        "id": st.integers(0, 5),
        "day": DAY,
        "amount": st.one_of(st.none(), INTS),
    }
    fields = {c: kinds.get(c, st.one_of(st.none(), st.integers(0, 3))) for c in columns}
    return st.lists(st.fixed_dictionaries(fields), min_size=min_size, max_size=max_size)


def leaves(columns: Sequence[str], side: str | None) -> st.SearchStrategy[Pred]:
    numeric = [c for c in columns if c in NUMERIC]
    ops = st.sampled_from(list(_OPS))
    return st.one_of(
        st.builds(lambda d: Cmp(Col("day", side), "=", Lit(d)), st.sampled_from(DAYS)),
        st.builds(
            lambda c, o, k: Cmp(Col(c, side), o, Lit(k)), st.sampled_from(numeric), ops, INTS
        ),
        st.builds(
            lambda c, n: IsNull(Col(c, side), n), st.sampled_from(["day", *numeric]), st.booleans()
        ),
        st.builds(
            lambda vs: In(Col("day", side), tuple(sorted(vs))),
            st.sets(st.sampled_from(DAYS), min_size=1, max_size=2),
        ),
        st.builds(
            lambda c, vs: In(Col(c, side), tuple(sorted(vs))),
            st.sampled_from(numeric),
            st.sets(INTS, min_size=1, max_size=3),
        ),
    )


def combined(inner: st.SearchStrategy[Pred]) -> st.SearchStrategy[Pred]:
    return st.one_of(
        st.builds(And, inner, inner), st.builds(Or, inner, inner), st.builds(Not, inner)
    )


def predicates(columns: Sequence[str], side: str | None = None) -> st.SearchStrategy[Pred]:
    return st.recursive(leaves(columns, side), combined, max_leaves=3)


def values_for(column: str, sides: Sequence[str | None]) -> st.SearchStrategy[Expr]:
    """Expressions a column may be set to: literals, columns of either side, sums."""
    cols = st.sampled_from([Col(column, s) for s in sides])
    if column == "day":
        return st.one_of(st.builds(Lit, DAY), cols)
    return st.one_of(
        st.builds(Lit, st.one_of(st.none(), INTS)),
        cols,
        st.builds(Add, cols, st.builds(Lit, INTS)),
        st.builds(Add, cols, st.sampled_from([Col("amount", s) for s in sides])),
    )


def updates_of(
    columns: Sequence[str], sides: Sequence[str | None]
) -> st.SearchStrategy[dict[str, Expr]]:
    return st.sets(st.sampled_from(list(columns)), min_size=1, max_size=2).flatmap(
        lambda chosen: st.fixed_dictionaries({c: values_for(c, sides) for c in sorted(chosen)})
    )


@dataclass(frozen=True)
class Clause:
    """A MERGE clause: ``updates`` None means ``*_all``."""

    kind: str  # update, delete, insert, delete_by_source
    pred: Pred | None
    updates: Mapping[str, Expr] | None = None


def clauses_of(columns: Sequence[str]) -> st.SearchStrategy[list[Clause]]:
    both = st.one_of(st.none(), leaves(columns, "source"), leaves(columns, "target"))
    source = st.one_of(st.none(), leaves(columns, "source"))
    target = st.one_of(st.none(), leaves(columns, "target"))
    clause = st.one_of(
        st.builds(Clause, st.just("update"), both, updates_of(columns, ("target", "source"))),
        st.builds(Clause, st.just("update"), both, st.none()),
        st.builds(Clause, st.just("delete"), both),
        st.builds(Clause, st.just("insert"), source, updates_of(columns, ("source",))),
        st.builds(Clause, st.just("insert"), source, st.none()),
        st.builds(Clause, st.just("delete_by_source"), target),
    )
    return st.lists(clause, min_size=1, max_size=4)


def plain_clauses(columns: Sequence[str]) -> st.SearchStrategy[list[Clause]]:
    """Clauses without predicates whose values are columns: what the Arrow path runs."""

    def setting(sides: Sequence[str]) -> st.SearchStrategy[dict[str, Expr]]:
        return st.sets(st.sampled_from(list(columns)), min_size=1, max_size=2).flatmap(
            lambda chosen: st.fixed_dictionaries(
                {c: st.sampled_from([Col(c, s) for s in sides]) for c in sorted(chosen)}
            )
        )

    clause = st.one_of(
        st.builds(Clause, st.just("update"), st.none(), setting(("target", "source"))),
        st.builds(Clause, st.just("update"), st.none(), st.none()),
        st.builds(Clause, st.just("delete"), st.none()),
        st.builds(Clause, st.just("insert"), st.none(), setting(("source",))),
        st.builds(Clause, st.just("insert"), st.none(), st.none()),
    )
    return st.lists(clause, min_size=1, max_size=3)


def merge_predicates(columns: Sequence[str]) -> st.SearchStrategy[Pred]:
    """A key equality, with partition pairs, target-only or source-only conjuncts."""
    key: Pred = Cmp(Col("id", "target"), "=", Col("id", "source"))
    extra = st.one_of(
        st.just(Cmp(Col("day", "target"), "=", Col("day", "source"))),
        leaves(columns, "target"),
        leaves(columns, "source"),
    )
    return st.lists(extra, max_size=2).map(lambda more: _and_all([key, *more]))


def _and_all(preds: Sequence[Pred]) -> Pred:
    out = preds[0]
    for p in preds[1:]:
        out = And(out, p)
    return out


# --- the model --------------------------------------------------------------------------


class MergeRefused(Exception):
    """The model's verdict: a target row is changed by more than one source row."""


@dataclass
class Outcome:
    """A statement's effect on the model: the new rows, or None when nothing commits."""

    rows: list[Row] | None
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    #: The change feed's rows of the version: ``(_change_type, row)``.
    changes: list[tuple[str, Row]] = field(default_factory=list)


def frame(columns: Sequence[str], rows: Sequence[Row]) -> pd.DataFrame:
    # ``object``: NULLs stay None, integers stay integers.
    return pd.DataFrame(
        [[r[c] for c in columns] for r in rows], columns=list(columns), dtype=object
    )


def records(df: pd.DataFrame) -> list[Row]:
    return [dict(zip(df.columns, values, strict=True)) for values in df.itertuples(index=False)]


def sort_key(values: Sequence[Value]) -> tuple[tuple[int, Value], ...]:
    return tuple((0, "") if v is None else (1, v) for v in values)


def canonical(df: pd.DataFrame) -> list[tuple[Value, ...]]:
    return sorted((tuple(r) for r in df.itertuples(index=False)), key=sort_key)


def model_merge(
    target: list[Row],
    source: list[Row],
    on: Pred,
    clauses: Sequence[Clause],
    columns: Sequence[str],
) -> Outcome:
    """MERGE as Delta defines it: the first clause whose predicate holds acts; a target
    row that more than one source row would act on fails the statement (unless the
    only matched clause is an unconditional delete)."""
    matched = [c for c in clauses if c.kind in ("update", "delete")]
    only_delete = len(matched) == 1 and matched[0].kind == "delete" and matched[0].pred is None

    def assigned(clause: Clause, env: Callable[[Col], Value], base: Row | None) -> Row:
        updates = clause.updates or {c: Col(c, "source") for c in columns}
        row = dict(base) if base is not None else dict.fromkeys(columns)
        row.update({c: e.eval(env) for c, e in updates.items()})
        return row

    out: list[Row] = []
    outcome = Outcome(None)
    source_matched = [False] * len(source)
    for t in target:
        joined = [j for j, s in enumerate(source) if on.eval(pair_env(t, s)) is True]
        for j in joined:
            source_matched[j] = True
        if not joined:
            first = next(
                (
                    c
                    for c in clauses
                    if c.kind == "delete_by_source" and holds(c.pred, pair_env(t, None))
                ),
                None,
            )
            if first is None:
                out.append(t)
            else:
                outcome.deleted += 1
                outcome.changes.append(("delete", t))
            continue
        acting = []
        for j in joined:
            env = pair_env(t, source[j])
            clause = next((c for c in matched if holds(c.pred, env)), None)
            if clause is not None:
                acting.append((clause, env))
        if len(acting) > 1 and not only_delete:
            raise MergeRefused
        if not acting:
            out.append(t)
        elif acting[0][0].kind == "delete":
            outcome.deleted += 1
            outcome.changes.append(("delete", t))
        else:
            outcome.updated += 1
            out.append(assigned(acting[0][0], acting[0][1], t))
            outcome.changes += [("update_preimage", t), ("update_postimage", out[-1])]
    inserts = [c for c in clauses if c.kind == "insert"]
    for j, s in enumerate(source):
        if source_matched[j]:
            continue
        env = pair_env(None, s)
        clause = next((c for c in inserts if holds(c.pred, env)), None)
        if clause is not None:
            outcome.inserted += 1
            out.append(assigned(clause, env, None))
            outcome.changes.append(("insert", out[-1]))
    if outcome.inserted or outcome.updated or outcome.deleted:
        outcome.rows = out
    return outcome


# --- the machine ------------------------------------------------------------------------

_tables = itertools.count()


class DmlModelMachine(RuleBasedStateMachine):
    """One table per example; ``versions[v]`` is the model's frame of version ``v`` and
    ``feeds[v]`` its change feed (``None``: an overwrite by predicate or of partitions,
    whose feed is the rows of the files it removed and added, see :meth:`check_feed`)."""

    lh: ClassVar[Lakehouse]
    spark: ClassVar[SparkSession]

    def __init__(self) -> None:
        super().__init__()
        self.name = f"t{next(_tables)}"
        self.lh.create_table(self.name, BASE, partition_by="day")
        self.schema = BASE
        self.versions: list[pd.DataFrame] = [frame(BASE.fieldNames(), [])]
        self.feeds: list[list[tuple[str, Row]] | None] = [[]]
        #: Per version read and found right: its files and their sizes.
        self.seen: list[dict[str, int]] = []

    # --- helpers --------------------------------------------------------------------

    @property
    def columns(self) -> list[str]:
        return self.schema.fieldNames()

    @property
    def head(self) -> int:
        return len(self.versions) - 1

    def current(self) -> list[Row]:
        return records(self.versions[-1])

    def df(self, rows: Sequence[Row]) -> DataFrame:
        return self.spark.createDataFrame([[r[c] for c in self.columns] for r in rows], self.schema)

    def commit(self, rows: list[Row], returned: int, feed: list[tuple[str, Row]] | None) -> None:
        self.versions.append(frame(self.columns, rows))
        self.feeds.append(feed)
        assert returned == self.head, f"returned version {returned}, the model is at {self.head}"

    def check_result(self, got: DmlResult, outcome: Outcome) -> None:
        before = self.head
        if outcome.rows is not None:
            self.versions.append(frame(self.columns, outcome.rows))
            self.feeds.append(outcome.changes)
        want = (self.head, outcome.inserted, outcome.updated, outcome.deleted)
        assert (got.version, got.rows_inserted, got.rows_updated, got.rows_deleted) == want, (
            f"{got} (version, inserted, updated, deleted) != {want}"
        )
        self.check_files(before, got)

    def check_files(self, before: int, got: DmlResult) -> None:
        """A result's file counts are the files its version dropped and added."""
        if got.version == before:
            assert (got.files_added, got.files_removed) == (0, 0), got
            return
        old = {f.path for f in self.lh.files(self.name, before)}
        new = {f.path for f in self.lh.files(self.name, got.version)}
        assert (got.files_added, got.files_removed) == (len(new - old), len(old - new)), got

    # --- writes ---------------------------------------------------------------------

    @initialize(data=st.data())
    def seed(self, data: st.DataObject) -> None:
        """Rows to start from: a statement on an empty table proves little."""
        self.append_rows(data.draw(rows_of(self.columns, min_size=2), label="seed rows"))

    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        self.append_rows(data.draw(rows_of(self.columns), label="rows"))

    def append_rows(self, rows: list[Row]) -> None:
        version = self.lh.append(self.name, self.df(rows))
        self.commit(self.current() + rows, version, [("insert", r) for r in rows])

    @rule(data=st.data())
    def overwrite(self, data: st.DataObject) -> None:
        rows = data.draw(rows_of(self.columns), label="rows")
        version = self.lh.overwrite(self.name, self.df(rows))
        feed = [("delete", r) for r in self.current()] + [("insert", r) for r in rows]
        self.commit(rows, version, feed)

    @rule(data=st.data())
    def replace_where(self, data: st.DataObject) -> None:
        pred = data.draw(predicates(self.columns), label="replace_where")
        rows = data.draw(rows_of(self.columns), label="rows")
        if data.draw(st.booleans(), label="only rows inside"):
            rows = [r for r in rows if holds(pred, row_env(r))]
        if not all(holds(pred, row_env(r)) for r in rows):
            with pytest.raises(ValueError, match="do not satisfy the predicate"):
                self.lh.overwrite(self.name, self.df(rows), replace_where=pred.sql())
            assert self.lh.version(self.name) == self.head
            return
        kept = [r for r in self.current() if not holds(pred, row_env(r))]
        version = self.lh.overwrite(self.name, self.df(rows), replace_where=pred.sql())
        if rows or len(kept) < len(self.current()):
            self.commit(kept + rows, version, None)
        else:
            assert version == self.head, "an overwrite that replaced nothing committed"

    @rule(data=st.data())
    def dynamic_overwrite(self, data: st.DataObject) -> None:
        rows = data.draw(rows_of(self.columns), label="rows")
        days = {r["day"] for r in rows}
        version = self.lh.overwrite(self.name, self.df(rows), dynamic_partitions=True)
        if rows:
            kept = [r for r in self.current() if r["day"] not in days]
            self.commit(kept + rows, version, None)
        else:
            assert version == self.head, "a dynamic overwrite of no rows committed"

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        pred = data.draw(st.one_of(st.none(), predicates(self.columns)), label="predicate")
        kept, gone = [], []
        for r in self.current():
            (gone if holds(pred, row_env(r)) else kept).append(r)
        got = self.lh.delete(self.name, pred.sql() if pred else None, spark=self.spark)
        feed = [("delete", r) for r in gone]
        self.check_result(got, Outcome(kept if gone else None, deleted=len(gone), changes=feed))

    @rule(data=st.data())
    def update(self, data: st.DataObject) -> None:
        pred = data.draw(st.one_of(st.none(), predicates(self.columns)), label="predicate")
        updates = data.draw(updates_of(self.columns, (None,)), label="updates")
        rows: list[Row] = []
        feed: list[tuple[str, Row]] = []
        for r in self.current():
            if holds(pred, row_env(r)):
                # Every expression sees the row before the statement.
                rows.append({**r, **{c: e.eval(row_env(r)) for c, e in updates.items()}})
                feed += [("update_preimage", r), ("update_postimage", rows[-1])]
            else:
                rows.append(r)
        got = self.lh.update(
            self.name,
            {c: e.sql() for c, e in updates.items()},
            pred.sql() if pred else None,
            spark=self.spark,
        )
        updated = len(feed) // 2
        self.check_result(got, Outcome(rows if feed else None, updated=updated, changes=feed))

    @rule(data=st.data())
    def merge(self, data: st.DataObject) -> None:
        on = data.draw(merge_predicates(self.columns), label="on")
        self.run_merge(data, on, data.draw(clauses_of(self.columns), label="clauses"))

    @rule(data=st.data())
    def plain_merge(self, data: st.DataObject) -> None:
        """A MERGE the Arrow path runs (``spark.merge_arrow``): keys only, clauses
        without predicates setting columns from columns. It must take that path."""
        on: Pred = Cmp(Col("id", "target"), "=", Col("id", "source"))
        if data.draw(st.booleans(), label="day is a key too"):
            on = And(on, Cmp(Col("day", "target"), "=", Col("day", "source")))
        clauses = data.draw(plain_clauses(self.columns), label="clauses")
        with merge_paths(spark_only=False) as paths:
            self.run_merge(data, on, clauses)
        assert paths == ["arrow"]

    def run_merge(self, data: st.DataObject, on: Pred, clauses: list[Clause]) -> None:
        source = data.draw(rows_of(self.columns, min_size=1), label="source")
        if data.draw(st.booleans(), label="source keys unique"):
            # Else most sources match some target row twice and the MERGE is refused.
            source = list({r["id"]: r for r in source}.values())
        builder = self.lh.merge(self.name, self.df(source), on.sql(), spark=self.spark)
        for c in clauses:
            pred = c.pred.sql() if c.pred is not None else None
            updates = {k: e.sql() for k, e in c.updates.items()} if c.updates else None
            if c.kind == "update":
                if updates is None:
                    builder.when_matched_update_all(pred)
                else:
                    builder.when_matched_update(updates, pred)
            elif c.kind == "delete":
                builder.when_matched_delete(pred)
            elif c.kind == "insert":
                if updates is None:
                    builder.when_not_matched_insert_all(pred)
                else:
                    builder.when_not_matched_insert(updates, pred)
            else:
                builder.when_not_matched_by_source_delete(pred)
        try:
            outcome = model_merge(self.current(), source, on, clauses, self.columns)
        except MergeRefused:
            with pytest.raises(ValueError, match=r"matched \d+ source rows"):
                builder.execute()
            assert self.lh.version(self.name) == self.head
            return
        self.check_result(builder.execute(), outcome)

    def missing_extra(self) -> str | None:
        return next((c for c in EXTRAS if c not in self.columns), None)

    @precondition(lambda self: self.missing_extra() is not None)
    @rule()
    def add_column(self) -> None:
        column = self.missing_extra()
        assert column is not None
        version = self.lh.add_columns(self.name, f"{column} INT")
        self.schema = StructType([*self.schema.fields, StructField(column, IntegerType())])
        self.commit([{**r, column: None} for r in self.current()], version, [])

    @precondition(lambda self: self.missing_extra() is not None)
    @rule(data=st.data())
    def append_merging_schema(self, data: st.DataObject) -> None:
        """An append whose rows bring a new nullable column (``merge_schema``): the
        column goes last, the table's rows read NULL in it, the feed inserts the rows."""
        column = self.missing_extra()
        assert column is not None
        schema = StructType([*self.schema.fields, StructField(column, IntegerType())])
        rows = data.draw(rows_of(schema.fieldNames(), min_size=1), label="rows")
        df = self.spark.createDataFrame([[r[c] for c in schema.fieldNames()] for r in rows], schema)
        version = self.lh.append(self.name, df, merge_schema=True)
        self.schema = schema
        old = [{**r, column: None} for r in self.current()]
        self.commit(old + rows, version, [("insert", r) for r in rows])

    @rule(data=st.data())
    def overwrite_replacing_schema(self, data: st.DataObject) -> None:
        """An overwrite whose DataFrame's schema becomes the table's (``overwrite_schema``):
        the base columns and any extras, in any order (an extra the table had may go;
        one it gets back later never shows the values it had before: no live file has
        them). The feed deletes every row before and inserts the new ones; a feed read
        with the new schema shows each old row's values of the columns it keeps."""
        extras = data.draw(st.lists(st.sampled_from(EXTRAS), unique=True), label="extras")
        names = data.draw(st.permutations([*BASE.fieldNames(), *extras]), label="columns")
        kinds = {f.name: f for f in BASE.fields}
        schema = StructType([kinds.get(c, StructField(c, IntegerType())) for c in names])
        rows = data.draw(rows_of(schema.fieldNames()), label="rows")
        df = self.spark.createDataFrame([[r[c] for c in schema.fieldNames()] for r in rows], schema)
        version = self.lh.overwrite(self.name, df, overwrite_schema=True)
        feed = [("delete", r) for r in self.current()] + [("insert", r) for r in rows]
        self.schema = schema
        self.commit(rows, version, feed)

    @rule(day=st.one_of(st.none(), st.sampled_from(DAYS)))
    def optimize(self, day: str | None) -> None:
        """Compaction commits iff a partition in scope has more than one file (every
        file here is far below the target), changes no row and has no change rows."""
        before = self.head
        in_scope = [
            f.partition["day"]
            for f in self.lh.files(self.name)
            if day is None or f.partition["day"] == day
        ]
        compacts = len(in_scope) > len(set(in_scope))
        got = self.lh.optimize(self.name, None if day is None else f"day = '{day}'")
        assert (got.rows_inserted, got.rows_updated, got.rows_deleted) == (0, 0, 0), got
        if compacts:
            self.commit(self.current(), got.version, [])
            files = [f.partition["day"] for f in self.lh.files(self.name)]
            assert all(files.count(d) == 1 for d in set(in_scope)), f"left {files}"
        assert got.version == self.head, f"{got}: the model is at {self.head}"
        self.check_files(before, got)

    # --- the checks -------------------------------------------------------------------

    @rule(data=st.data())
    def changes(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(0, self.head), label="starting_version")
        end = data.draw(st.one_of(st.none(), st.integers(start, self.head + 1)), label="end")
        self.check_feed(start, end)

    def check_feed(self, start: int, end: int | None) -> None:
        """``lh.changes`` of ``start..end`` against the model, version by version.

        Statements and whole overwrites: exactly the model's change rows. Overwrites by
        predicate or of partitions give every row of each file they removed and added,
        which the model does not know: their deletes must be rows of the version
        before, their inserts rows of the version, and the version before less the
        deletes plus the inserts must be the version."""
        last = self.head if end is None else min(end, self.head)
        columns = list(self.versions[last].columns)
        df = self.lh.changes(self.spark, self.name, start, end)
        assert df.columns == [*columns, "_change_type", "_commit_version", "_commit_timestamp"]
        got: dict[int, Counter[tuple[str, tuple[Value, ...]]]] = {}
        for r in df.collect():
            key = (r["_change_type"], tuple(r[c] for c in columns))
            got.setdefault(r["_commit_version"], Counter())[key] += 1
        assert set(got) <= set(range(start, last + 1)), f"feed of versions {sorted(got)}"

        def padded(rows: Iterable[Row]) -> Counter[tuple[Value, ...]]:
            return Counter(tuple(r.get(c) for c in columns) for r in rows)

        for version in range(start, last + 1):
            feed, rows = self.feeds[version], got.get(version, Counter())
            if feed is not None:
                want = Counter((kind, tuple(r.get(c) for c in columns)) for kind, r in feed)
                assert rows == want, f"version {version}: feed {rows}, the model {want}"
                continue
            kinds = {kind for kind, _ in rows}
            assert kinds <= {"insert", "delete"}, f"version {version}: {kinds}"
            deletes = Counter({r: n for (k, r), n in rows.items() if k == "delete"})
            inserts = Counter({r: n for (k, r), n in rows.items() if k == "insert"})
            before = padded(records(self.versions[version - 1]))
            after = padded(records(self.versions[version]))
            assert not deletes - before, f"version {version} deleted rows it did not have"
            assert not inserts - after, f"version {version} inserted rows it does not have"
            assert before - deletes + inserts == after, f"version {version}: {rows}"

    @invariant()
    def every_version_matches_the_model(self) -> None:
        """The newest version read in full; each older one by its files, unchanged
        since it was read (a version is its files: they are written once, never
        changed). :meth:`teardown` reads every version in full again."""
        assert self.lh.version(self.name) == self.head
        for version in range(len(self.seen)):
            files = {f.path: os.stat(f.path).st_size for f in self.lh.files(self.name, version)}
            assert files == self.seen[version], f"version {version}'s files changed"
        for version in range(len(self.seen), self.head + 1):
            got = read_versions(self.lh, self.spark, self.name, [version])
            self.assert_version(version, *got[version])
            self.seen.append(
                {f.path: os.stat(f.path).st_size for f in self.lh.files(self.name, version)}
            )

    def teardown(self) -> None:
        """Every version in full by time travel, and the whole change feed, when the
        steps all passed (a failed one reports its own error)."""
        if len(self.seen) != len(self.versions) or self.lh.version(self.name) != self.head:
            return
        got = read_versions(self.lh, self.spark, self.name, range(self.head + 1))
        for version in range(self.head + 1):
            self.assert_version(version, *got[version])
        self.check_feed(0, None)

    def assert_version(
        self, version: int, columns: list[str], rows: list[tuple[Value, ...]]
    ) -> None:
        want = self.versions[version]
        assert columns == list(want.columns), f"version {version} has columns {columns}"
        assert rows == canonical(want), (
            f"version {version}: table has {rows}, the model {canonical(want)}"
        )


def read_versions(
    lh: Lakehouse, spark: SparkSession, name: str, versions: Iterable[int]
) -> dict[int, tuple[list[str], list[tuple[Value, ...]]]]:
    """Each version's columns and sorted rows, read by time travel in one Spark job:
    each row as JSON keeping its NULL fields, so versions of other schemas share it."""
    parts: list[DataFrame] = []
    columns: dict[int, list[str]] = {}
    for version in versions:
        df = lh.read(spark, name, version=version)
        columns[version] = df.columns
        parts.append(
            df.select(
                F.lit(version).alias("v"),
                F.to_json(F.struct(*df.columns), {"ignoreNullFields": "false"}).alias("j"),
            )
        )
    union = parts[0]
    for part in parts[1:]:
        union = union.unionAll(part)
    rows: dict[int, list[tuple[Value, ...]]] = {v: [] for v in columns}
    for r in union.collect():
        decoded = json.loads(r["j"])
        rows[r["v"]].append(tuple(decoded[c] for c in columns[r["v"]]))
    return {v: (columns[v], sorted(rows[v], key=sort_key)) for v in columns}


SETTINGS = settings(
    max_examples=LONG_EXAMPLES or 2,
    stateful_step_count=12 if LONG_EXAMPLES else 6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _run(lh: Lakehouse, spark: SparkSession, run_settings: settings) -> None:
    class Machine(DmlModelMachine):
        pass

    Machine.lh = lh
    Machine.spark = spark
    run_state_machine_as_test(Machine, settings=run_settings)


@pytest.mark.parametrize("lh", ["embedded"], indirect=True)
def test_dml_matches_the_model_embedded(lh: Lakehouse, spark: SparkSession) -> None:
    _run(lh, spark, SETTINGS)


@pytest.mark.integration
@pytest.mark.parametrize("lh", ["remote"], indirect=True)
def test_dml_matches_the_model_through_a_gateway(lh: Lakehouse, spark: SparkSession) -> None:
    one = settings(SETTINGS, max_examples=1, stateful_step_count=5)
    _run(lh, spark, SETTINGS if LONG_EXAMPLES else one)
