"""What a DML commit read, and the check that nothing it read changed before it commits.

A row-level statement (``DELETE``, ``UPDATE``, ``MERGE``) reads a snapshot of
its table, rewrites the files holding matching rows and commits the result: the
live files at the head, minus those it rewrote (removal rows), plus the files it
wrote (``commit``). Its :class:`ReadSet` says what that result depends on:

* ``version``: the snapshot it read;
* ``removes``: the files it rewrote or dropped (relative paths);
* ``conditions``: the part of its predicate that can be decided from a file's
  partition values and column statistics, as a conjunction. A file for which
  :meth:`ReadSet.may_match` is false holds no row the statement would touch.
  Conditions may only ever be *wider* than the predicate (a conjunct not
  understood is left out; no condition at all means every row);
* ``reads``: files it read and kept whose rows its result still depends on. A
  ``MERGE`` inserts a source row only when no target row joins it, so the files
  holding rows that joined a source row must not change under it even when it
  leaves them as they are.

:func:`find_conflict` runs inside the commit's transaction, after it read the head:

1. every file in ``removes`` and ``reads`` must still be live at the head (a
   concurrent commit that rewrote or dropped it changed rows this statement read);
2. no file that became live after ``version`` may match ``conditions`` (a
   concurrent commit added rows the statement would have had to touch).

A compaction (``OPTIMIZE``) changes no row, so only rule 1 applies to it: the
files it rewrote must still be live, and files added since stay live beside its own.

If both hold, committing here gives exactly the table that running the statement
on the head would give: the files it left alone held no matching row in the
snapshot and are the same immutable files at the head; the files it rewrote or
depends on are still live; and every file added since holds no matching row. Commits of one table
are totally ordered by its head cell (each writes it; first committer wins), so
every history is equivalent to running its commits one by one in that order:
serializable at table level (docs/design/lakehouse.md). Otherwise the statement
fails with ``ConcurrentModificationError`` and commits nothing.

Pure Python over the catalog's cells: no Spark, no pyarrow.
"""

from __future__ import annotations

import datetime
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_integration.engine.checkpoints import list_gen
from spark_integration.engine.model import FileEntry, Head, Layout
from spark_integration.engine.table_access import TableAccess
from txn import Transaction

#: Comparison operators of a condition, and how each compares a value with the literal.
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
IN, IS_NULL, NOT_NULL = "in", "is_null", "not_null"
OPERATORS = frozenset({*_COMPARE, IN, IS_NULL, NOT_NULL})
#: Value kinds: how a partition value's text and a statistic are read for comparison.
KINDS = frozenset({"int", "str", "bool", "date"})

#: A value of a condition: JSON scalars (a date as its ISO string).
Literal = int | str | bool


class _Unknown(Exception):
    """A value this module cannot compare for certain: the file may match."""


@dataclass(frozen=True, slots=True)
class Condition:
    """``column op values``: one conjunct of a statement's predicate.

    ``values`` holds one literal for a comparison, the list for ``in``, none for the
    null tests. ``kind`` is the column's value kind (see :data:`KINDS`).
    """

    column: str
    op: str
    kind: str
    values: tuple[Literal, ...] = ()

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"unknown condition operator {self.op!r}")
        if self.kind not in KINDS:
            raise ValueError(f"unknown condition kind {self.kind!r}")
        wanted = 1 if self.op in _COMPARE else None if self.op == IN else 0
        if wanted is not None and len(self.values) != wanted:
            raise ValueError(f"condition {self.op!r} takes {wanted} values, got {self.values}")
        if self.op == IN and not self.values:
            raise ValueError("an 'in' condition needs at least one value")

    def may_match(self, entry: FileEntry) -> bool:
        """False only if no row of ``entry`` can satisfy the condition."""
        try:
            if self.column in entry.partition:
                return self._partition_matches(entry.partition[self.column])
            stats = (entry.stats or {}).get(self.column)
            if stats is None:
                return True
            if self.op == IS_NULL:
                return stats.null_count is None or stats.null_count > 0
            if self.op == NOT_NULL:
                return stats.null_count is None or stats.null_count < entry.record_count
            if stats.min_value is None or stats.max_value is None:
                return True
            low, high = self._value(stats.min_value), self._value(stats.max_value)
            values = [self._value(v) for v in self.values]
        except (_Unknown, ValueError, TypeError):
            return True
        if self.op in (IN, "="):
            return any(low <= v <= high for v in values)
        (value,) = values
        if self.op == "<":
            return bool(low < value)
        if self.op == "<=":
            return bool(low <= value)
        if self.op == ">":
            return bool(high > value)
        return bool(high >= value)

    def _partition_matches(self, text: str | None) -> bool:
        """Exact: every row of the file has this partition value (SQL: null is not true)."""
        if self.op == IS_NULL:
            return text is None
        if self.op == NOT_NULL:
            return text is not None
        if text is None:
            return False
        value = self._value(text, parse=True)
        values = [self._value(v) for v in self.values]
        if self.op == IN:
            return value in values
        return _COMPARE[self.op](value, values[0])

    def _value(self, raw: Literal, *, parse: bool = False) -> Any:
        """``raw`` as a comparable value of the condition's kind, else ``_Unknown``."""
        kind = self.kind
        if kind == "int":
            if isinstance(raw, str) and parse:
                return int(raw)
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise _Unknown(raw)
            return raw
        if kind == "bool":
            if isinstance(raw, str) and parse and raw in ("true", "false"):
                return raw == "true"
            if not isinstance(raw, bool):
                raise _Unknown(raw)
            return raw
        if not isinstance(raw, str):
            raise _Unknown(raw)
        return datetime.date.fromisoformat(raw) if kind == "date" else raw

    def to_json(self) -> list[Any]:
        return [self.column, self.op, self.kind, list(self.values)]

    @classmethod
    def from_json(cls, item: Any) -> Condition:
        if not isinstance(item, list) or len(item) != 4 or not isinstance(item[3], list):
            raise ValueError(f"a condition is [column, op, kind, [values]], got {item!r}")
        column, op, kind, values = item
        if not isinstance(column, str) or not isinstance(op, str) or not isinstance(kind, str):
            raise ValueError(f"a condition's column, op and kind are strings, got {item!r}")
        for v in values:
            if not isinstance(v, int | str):  # bool is an int
                raise ValueError(f"condition values are JSON scalars, got {v!r}")
        return cls(column, op, kind, tuple(values))


@dataclass(frozen=True, slots=True)
class ReadSet:
    """What a DML statement read: see the module docstring."""

    version: int
    removes: tuple[str, ...]
    conditions: tuple[Condition, ...] = ()
    reads: tuple[str, ...] = ()

    def may_match(self, entry: FileEntry) -> bool:
        """False only if no row of ``entry`` can satisfy every condition."""
        return all(c.may_match(entry) for c in self.conditions)

    def conditions_json(self) -> str:
        """The conditions as one JSON array (the wire's ``conditions_json``)."""
        return json.dumps([c.to_json() for c in self.conditions], separators=(",", ":"))

    @staticmethod
    def parse_conditions(text: str) -> tuple[Condition, ...]:
        """Conditions from :meth:`conditions_json`; ``ValueError`` if malformed."""
        if not text:
            return ()
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"read set conditions are not JSON: {exc}") from None
        if not isinstance(items, list):
            raise ValueError("read set conditions must be a JSON array")
        return tuple(Condition.from_json(item) for item in items)

    def describe(self) -> str:
        if not self.conditions:
            return "every row"
        return " AND ".join(
            f"{c.column} {c.op} {list(c.values) if c.op == IN else ''.join(map(str, c.values))}"
            for c in self.conditions
        )


def widen(alternatives: Sequence[Sequence[Condition]]) -> tuple[Condition, ...]:
    """One conjunction true wherever any of ``alternatives`` (conjunctions) is.

    A statement that touches rows of several kinds (a ``MERGE``'s matched rows and
    the rows of its ``not matched by source`` clauses) reads their union, but a read
    set holds one conjunction. Kept: a condition every alternative has, and an
    equality or ``in`` on a column that every alternative has one of (the union of
    their values). Everything else is dropped, which only ever widens.
    """
    if not alternatives:
        return ()
    first, *rest = [list(a) for a in alternatives]
    out: list[Condition] = []
    for condition in first:
        if all(condition in other for other in rest):
            out.append(condition)
            continue
        if condition.op not in ("=", IN):
            continue
        values = list(condition.values)
        for other in rest:
            same = [
                c
                for c in other
                if c.column == condition.column and c.kind == condition.kind and c.op in ("=", IN)
            ]
            if not same:
                break
            values.extend(v for c in same[:1] for v in c.values)
        else:
            unique = tuple(dict.fromkeys(values))
            out.append(Condition(condition.column, IN, condition.kind, unique))
    return tuple(out)


def check_read_set(read_set: ReadSet) -> None:
    """A read set's own consistency (the service checks what clients send)."""
    if read_set.version < 0:
        raise ValueError(f"a read set's version must not be negative, got {read_set.version}")
    if len(set(read_set.removes)) != len(read_set.removes):
        raise ValueError("a read set names a removed file more than once")
    if len(set(read_set.reads)) != len(read_set.reads):
        raise ValueError("a read set names a kept file more than once")
    both = set(read_set.removes) & set(read_set.reads)
    if both:
        raise ValueError(f"a read set names file {sorted(both)[0]} as removed and as kept")


def find_conflict(
    tx: Transaction,
    tables: TableAccess,
    name: str,
    head: Head,
    read_set: ReadSet,
    *,
    judge_added: bool = True,
) -> tuple[list[FileEntry], str | None]:
    """The live files at ``head`` and, if the statement may not commit, why.

    Runs in the commit's transaction, which read ``head``: the answer holds at the
    commit point, since any commit after it changes the head and makes this
    transaction lose (and retry, checking again).

    ``judge_added=False`` checks rule 1 only: for a compaction (``OPTIMIZE``), which
    changes no row, so files added since its snapshot cannot change what it
    writes; they stay live beside its files. Only a commit that removed a file
    it rewrote (whose rows it would otherwise bring back) conflicts with it.
    """
    layout = tables.layout
    live = list_gen(tx, layout, name, head.gen, head.version, FileEntry, gen_start=head.gen_start)
    if read_set.version > head.version:
        return live, (
            f"the statement read version {read_set.version} of table {name!r}, "
            f"which is newer than its head {head.version}"
        )
    live_paths = {e.path for e in live}
    gone = [path for path in (*read_set.removes, *read_set.reads) if path not in live_paths]
    if gone:
        return live, (
            f"file {gone[0]} that the statement read (as of version {read_set.version}) was "
            f"rewritten or removed by a concurrent commit of table {name!r} (now at "
            f"version {head.version})"
        )
    if head.version == read_set.version or not judge_added:
        return live, None
    added = _added_since(tx, tables, name, head, read_set.version, live)
    if added is None:
        return live, (
            f"version {read_set.version} of table {name!r}, which the statement read, is no "
            "longer readable, so the files added since cannot be told apart"
        )
    for entry in added:
        if read_set.may_match(entry):
            where = ", ".join(f"{c}={v}" for c, v in entry.partition.items()) or "the table"
            return live, (
                f"a concurrent commit of table {name!r} added file {entry.path} in {where} "
                f"that may hold rows matching the statement's predicate "
                f"({read_set.describe()}) after version {read_set.version}"
            )
    return live, None


def _added_since(
    tx: Transaction,
    tables: TableAccess,
    name: str,
    head: Head,
    version: int,
    live: Sequence[FileEntry],
) -> list[FileEntry] | None:
    """The live files at ``head`` that were not live at ``version``; ``None`` if unknown."""
    if version >= head.gen_start:
        # One generation since the read: the files added after it, keyed by version,
        # that no later removal row took away again.
        start, end = Layout.file_range(
            name, head.gen, from_version=version + 1, below_version=head.version + 1
        )
        live_paths = {e.path for e in live}
        return [e for _, e in tables.scan_files(tx, name, start, end) if e.path in live_paths]
    if version < head.min_readable_version:
        return None
    gen, gen_start = tables.gen_of(tx, name, version)
    listed = list_gen(tx, tables.layout, name, gen, version, FileEntry, gen_start=gen_start)
    before = {e.path for e in listed}
    return [e for e in live if e.path not in before]
