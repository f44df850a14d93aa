"""Per-column statistics of a Parquet file, from its footer (what Delta keeps as ``stats``).

The footer has min, max and null count per row group and leaf column; a file's
statistics are their union. Only flat columns of types whose Parquet order is the
order Spark compares in are kept with bounds (see :class:`ColumnStats`); others get
their null count only. Statistics are a hint for skipping files, never data: a
bound that is not certain is left out.
"""

from __future__ import annotations

import datetime
from typing import Any

from spark_integration.engine.model import ColumnStats, FileStats, StatValue

#: Longer strings keep no bounds: a long min or max would bloat every listing of the
#: file, and a truncated max would no longer bound anything.
MAX_STAT_CHARS = 64


def _bounded_kind(kind: Any) -> bool:
    import pyarrow as pa  # not at the top: see spark.datasource.files

    return bool(
        pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_date(kind)
    )


def _stat_value(value: Any) -> StatValue | None:
    """A footer statistic as a JSON scalar, or ``None`` if it cannot be kept exactly."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_STAT_CHARS else None
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    return None


def file_stats(metadata: Any) -> FileStats:
    """Statistics of each flat column of the file whose ``pyarrow`` footer is ``metadata``."""
    arrow_schema = metadata.schema.to_arrow_schema()
    top_level = {field.name: field.type for field in arrow_schema}
    out: FileStats = {}
    for index in range(metadata.num_columns):
        column = metadata.schema.column(index)
        name = column.path
        if name not in top_level or "." in name:
            continue  # a leaf of a nested column: its name is not a Spark column
        kind = top_level[name]
        nulls: int | None = 0
        bounded = _bounded_kind(kind)
        low: Any = None
        high: Any = None
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            stats = row_group.column(index).statistics
            if stats is None:
                nulls = None
                bounded = bounded and row_group.num_rows == 0
                continue
            group_nulls = stats.null_count if stats.has_null_count else None
            nulls = None if nulls is None or group_nulls is None else nulls + group_nulls
            if stats.has_min_max:
                low = stats.min if low is None else min(low, stats.min)
                high = stats.max if high is None else max(high, stats.max)
            elif group_nulls is None or group_nulls < row_group.num_rows:
                bounded = False  # values without bounds: nothing certain about them
        low_value = _stat_value(low) if bounded else None
        high_value = _stat_value(high) if bounded else None
        if low_value is None or high_value is None:
            low_value = high_value = None
        if nulls is None and low_value is None:
            continue
        out[name] = ColumnStats(nulls, low_value, high_value)
    return out
