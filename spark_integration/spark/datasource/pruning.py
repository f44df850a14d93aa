"""Which files of a pinned snapshot a filtered read needs (the reader's ``pushFilters``).

Spark hands a Python data source the conjuncts of a query's filter as
``pyspark.sql.datasource.Filter`` objects. Two kinds of pruning follow:

- **Partition filters** name a partition column. Every row of a file has the file's
  partition value, so a filter evaluated on that value (SQL's three-valued logic: a
  file is kept only when the filter is *true*) decides for every row at once: such a
  filter is fully handled and Spark need not apply it again.
- **Statistics** (``ColumnStats`` of data columns) can only prove that *no* row of a
  file matches (a value outside ``[min, max]``, no nulls for ``IS NULL``, ...). Files
  so proven are skipped; the filter is still returned for Spark to apply to the rest.

Anything not understood (another filter kind, a column type whose text form is not
certain to parse back, a value of an unexpected type) prunes nothing and goes back
to Spark: pruning may only ever drop files that hold no matching row.
"""

from __future__ import annotations

import datetime
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
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

from spark_integration.engine.model import ColumnStats, FileStats

#: Spark's default string order (byte order of UTF-8, which is Python's code point
#: order); a column with another collation compares differently and is left alone.
_BINARY_COLLATION = "UTF8_BINARY"

_COMPARISONS: dict[type[Filter], Callable[[Any, Any], bool]] = {
    GreaterThan: operator.gt,
    GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt,
    LessThanOrEqual: operator.le,
}

_STRING_MATCHES: dict[type[Filter], Callable[[str, str], bool]] = {
    StringStartsWith: str.startswith,
    StringEndsWith: str.endswith,
    StringContains: operator.contains,
}


@dataclass(frozen=True, slots=True)
class Candidate:
    """What pruning knows of one file: its partition values, rows and statistics."""

    partition: dict[str, str | None]
    record_count: int
    stats: FileStats | None


class _Unknown(Exception):
    """A filter, type or value pruning does not understand: it prunes nothing."""


def _python_type(kind: DataType) -> type | None:
    """The Python type Spark gives a filter value on a column of ``kind``, if pruned on."""
    if isinstance(kind, ByteType | ShortType | IntegerType | LongType):
        return int
    if isinstance(kind, BooleanType):
        return bool
    if isinstance(kind, DateType):
        return datetime.date
    if isinstance(kind, StringType) and getattr(kind, "collation", None) == _BINARY_COLLATION:
        return str
    return None


def _parse(text: str, kind: type) -> Any:
    """A partition value or a statistic as a Python value of ``kind``."""
    if kind is str:
        return text
    if kind is int:
        return int(text)
    if kind is bool:
        if text not in ("true", "false"):
            raise _Unknown(text)
        return text == "true"
    return datetime.date.fromisoformat(text)


def _check_value(value: Any, kind: type) -> None:
    """``value`` (a filter's literal) is a ``kind`` or null, else ``_Unknown``."""
    if value is None:
        return
    if kind is int:
        # bool is an int: a boolean literal is not one Spark pushes for an integer
        # column, and comparing the two would be wrong.
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is datetime.date:
        ok = isinstance(value, datetime.date) and not isinstance(value, datetime.datetime)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise _Unknown(value)


def _check_values(f: Filter, kind: type) -> None:
    if isinstance(f, In):
        for v in f.value:
            _check_value(v, kind)
    elif not isinstance(f, IsNull | IsNotNull):
        _check_value(getattr(f, "value", None), kind)


def _bound(stat: Any, kind: type) -> Any:
    """A statistic as a value of ``kind`` (dates are kept as ISO strings)."""
    if kind is datetime.date:
        if not isinstance(stat, str):
            raise _Unknown(stat)
        return datetime.date.fromisoformat(stat)
    _check_value(stat, kind)
    return stat


class Pruner:
    """Evaluates filters against files of one table (its schema and partition columns)."""

    def __init__(self, schema: StructType, partition_by: Sequence[str]) -> None:
        self.partition_by = frozenset(partition_by)
        self.kinds = {f.name: _python_type(f.dataType) for f in schema.fields}

    def _column(self, f: Filter) -> tuple[str, type]:
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        if len(attribute) != 1:
            raise _Unknown(attribute)  # a nested field, or no column at all
        name = attribute[0]
        kind = self.kinds.get(name)
        if kind is None:
            raise _Unknown(name)
        return name, kind

    # -- partition filters: exact ---------------------------------------------------------

    def is_partition_filter(self, f: Filter) -> bool:
        """Whether ``f`` decides every row of a file from its partition values alone."""
        try:
            self._partition_value(f, None)
        except _Unknown:
            return False
        return True

    def _partition_value(self, f: Filter, file: Candidate | None) -> bool | None:
        """``f`` on the file's partition value: true, false or SQL null (unknown).

        Without a file, only checks that ``f`` can be evaluated so.
        """
        if isinstance(f, Not):
            result = self._partition_value(f.child, file)
            return None if result is None else not result
        if not isinstance(f, _HANDLED):
            raise _Unknown(f)
        name, kind = self._column(f)
        if name not in self.partition_by:
            raise _Unknown(name)
        _check_values(f, kind)
        if file is None:
            return None
        text = file.partition.get(name)
        return _evaluate(f, None if text is None else _parse(text, kind))

    def keeps_by_partition(self, f: Filter, file: Candidate) -> bool:
        return self._partition_value(f, file) is True

    # -- statistics: only "certainly no row" -----------------------------------------------

    def may_match(self, f: Filter, file: Candidate) -> bool:
        """False only if the file's statistics prove that no row satisfies ``f``."""
        try:
            name, kind = self._column(f)
        except _Unknown:
            return True
        stats = (file.stats or {}).get(name)
        if name in self.partition_by or stats is None:
            return True
        try:
            return _stats_may_match(f, stats, file.record_count, kind)
        except (_Unknown, ValueError, TypeError):
            return True


_HANDLED = (
    EqualTo,
    EqualNullSafe,
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
    In,
    IsNull,
    IsNotNull,
    StringStartsWith,
    StringEndsWith,
    StringContains,
)


def _evaluate(f: Filter, value: Any) -> bool | None:
    """SQL's value of ``f`` for a row whose column holds ``value`` (None: null)."""
    if isinstance(f, IsNull):
        return value is None
    if isinstance(f, IsNotNull):
        return value is not None
    if isinstance(f, EqualNullSafe):
        return bool(value == f.value) if (value is None) == (f.value is None) else False
    if value is None:
        return None
    if isinstance(f, EqualTo):
        return None if f.value is None else bool(value == f.value)
    if isinstance(f, In):
        if value in [v for v in f.value if v is not None]:
            return True
        return None if any(v is None for v in f.value) else False
    literal = getattr(f, "value", None)
    compare = _COMPARISONS.get(type(f))
    if compare is not None:
        return None if literal is None else compare(value, literal)
    match = _STRING_MATCHES.get(type(f))
    if match is not None and isinstance(value, str) and isinstance(literal, str):
        return match(value, literal)
    raise _Unknown(f)


def _stats_may_match(f: Filter, stats: ColumnStats, rows: int, kind: type) -> bool:
    """False only if ``stats`` prove that no row of the file satisfies ``f``."""
    if isinstance(f, IsNull):
        return stats.null_count is None or stats.null_count > 0
    if isinstance(f, IsNotNull):
        return stats.null_count is None or stats.null_count < rows
    if stats.min_value is None or stats.max_value is None:
        return True
    _check_values(f, kind)
    low, high = _bound(stats.min_value, kind), _bound(stats.max_value, kind)
    if isinstance(f, EqualTo | EqualNullSafe):
        return f.value is None or bool(low <= f.value <= high)
    if isinstance(f, In):
        return any(low <= v <= high for v in f.value if v is not None)
    value = getattr(f, "value", None)
    if type(f) in _COMPARISONS and value is not None:
        if isinstance(f, GreaterThan):
            return bool(high > value)
        if isinstance(f, GreaterThanOrEqual):
            return bool(high >= value)
        if isinstance(f, LessThan):
            return bool(low < value)
        return bool(low <= value)
    return True


@dataclass(frozen=True, slots=True)
class Pruned:
    """The files a filtered read keeps (indices into the input) and what Spark still applies."""

    kept: list[int]
    remaining: list[Filter]


def prune(
    files: Sequence[Candidate],
    filters: Sequence[Filter],
    schema: StructType,
    partition_by: Sequence[str],
) -> Pruned:
    """Drop the files no row of which can satisfy every filter in ``filters`` (an AND).

    Partition filters are evaluated exactly and not returned; every other filter is
    returned, whatever the statistics pruned. A partition value that does not parse
    as its column's type (a hand-made table, say) turns its filter into one Spark
    applies, with nothing pruned by it.
    """
    pruner = Pruner(schema, partition_by)
    exact: list[Filter] = []
    remaining: list[Filter] = []
    for f in filters:
        (exact if pruner.is_partition_filter(f) else remaining).append(f)
    keep = [True] * len(files)
    for f in exact:
        try:
            decided = [pruner.keeps_by_partition(f, file) for file in files]
        except (_Unknown, ValueError):
            remaining.append(f)
            continue
        keep = [k and d for k, d in zip(keep, decided, strict=True)]
    for f in remaining:
        keep = [k and pruner.may_match(f, file) for k, file in zip(keep, files, strict=True)]
    # Spark needs the unhandled filters by identity and in no particular order.
    return Pruned([i for i, k in enumerate(keep) if k], remaining)
