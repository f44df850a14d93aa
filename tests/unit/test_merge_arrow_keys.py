"""MERGE's one pass (``spark.merge_arrow``) looks each file's keys up in the source's:
the lookup must be SQL's ``=`` join of the two (a NULL equals nothing), for each key
kind, compared here with ``pyarrow``'s hash join."""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from spark_integration.spark.merge_arrow import _SourceKeys

pytestmark = pytest.mark.unit


def _joined(target: pa.Array, source: pa.Array) -> list[tuple[int, int]]:
    """(target row, source row) pairs of the inner equi-join, by pyarrow's hash join."""
    left = pa.table({"k": target, "t": np.arange(len(target))})
    right = pa.table({"k": source, "s": np.arange(len(source))})
    pairs = left.join(right, "k", join_type="inner").select(["t", "s"]).to_pylist()
    return sorted((p["t"], p["s"]) for p in pairs)


D = datetime.date


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (pa.array([5, None, -3, 9, 0], pa.int64()), pa.array([0, 9, None, 7, 5, 5, -3])),
        (pa.array([], pa.int64()), pa.array([1, None, 2], pa.int64())),
        (pa.array([None, None], pa.int64()), pa.array([None, 0], pa.int64())),
        (pa.array([2**62, -(2**62)]), pa.array([2**62, 0, -(2**62), 2**62 - 1])),
        (
            pa.array([D(2024, 1, 2), None, D(1970, 1, 1)]),
            pa.array([D(1970, 1, 1), None, D(2024, 1, 2), D(2024, 1, 3)]),
        ),
        (pa.array(["b", None, "", "a"]), pa.array(["a", "", None, "c", "b", "a"])),
    ],
    ids=["ints", "empty_source", "null_source", "large", "dates", "strings"],
)
def test_lookup_is_the_equi_join(source: pa.Array, target: pa.Array) -> None:
    rows, sources = _SourceKeys.of(source).lookup(target)
    got: list[Any] = sorted(zip(rows.tolist(), sources.tolist(), strict=True))
    assert got == _joined(target, source)
    assert list(rows) == sorted(rows)  # ascending target rows


def test_lookup_of_many_keys_against_the_hash_join() -> None:
    rng = np.random.default_rng(7)
    source = pa.array(rng.permutation(100_000)[:5_000] * 3 - 1_000, pa.int64())
    values = rng.integers(-2_000, 300_000, 20_000)
    target = pa.array(values, mask=rng.random(20_000) < 0.1)
    rows, sources = _SourceKeys.of(source).lookup(target)
    assert len(rows) > 100
    assert sorted(zip(rows.tolist(), sources.tolist(), strict=True)) == _joined(target, source)
