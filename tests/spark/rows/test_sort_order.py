"""Segments sorted by integer codes (:func:`shuffled.spark.rows.grouping.sort_order`,
:func:`shuffled.spark.rows.rollup.sorted_by`) come out in exactly the order Arrow's own
``sort_by`` (ascending, nulls first, stable) gave them: strings by their bytes, integers by
value over their whole range, nulls first, ties in input order, dictionary-encoded and
plain strings alike; keys of other types fall back to Arrow's sort."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.spark.rows import rollup
from shuffled.spark.rows.grouping import sort_order
from shuffled.spark.rows.rollup import sorted_by


@pytest.fixture(autouse=True)
def codes_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small tables too go through the codes (in production only large ones do)."""
    monkeypatch.setattr(rollup, "CODES_MIN_ROWS", 2)


STRINGS = st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "Z", "é", "a\x00", "ü1"]),
                    st.text(max_size=4))
INTS = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([-(2 ** 63), 2 ** 63 - 1]))


def _arrow(table: pa.Table, keys: list[str]) -> list[int]:
    plain = table.cast(pa.schema([pa.field(f.name, f.type.value_type)
                                  if pa.types.is_dictionary(f.type) else f
                                  for f in table.schema]))
    return plain.sort_by([(k, "ascending", "at_start") for k in keys]).column("row").to_pylist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(INTS, STRINGS, INTS, STRINGS), max_size=60), st.booleans(),
       st.permutations(["a", "s", "b", "t"]))
def test_codes_sort_as_arrow_sorts(rows: list[tuple], encoded: bool, keys: list[str]) -> None:
    cols = list(zip(*rows)) if rows else [(), (), (), ()]
    table = pa.table({"a": pa.array(cols[0], pa.int64()), "s": pa.array(cols[1], pa.string()),
                      "b": pa.array(cols[2], pa.int64()), "t": pa.array(cols[3], pa.string()),
                      "row": pa.array(np.arange(len(rows)))})
    if encoded:
        table = table.set_column(1, "s", table.column("s").dictionary_encode())
    got = sorted_by(table, keys).column("row").to_pylist()
    assert got == _arrow(table, keys)


def test_a_wide_prefix_is_ranked_not_overflowed() -> None:
    """Eight keys of a thousand values each pass int64 when mixed: the prefix so far is
    replaced by its rank, which keeps the order."""
    rng = np.random.default_rng(1)
    n = 5_000
    table = pa.table({f"k{i}": pa.array(rng.integers(0, 1000, n) * 1_000_003, pa.int64())
                      for i in range(8)} | {"row": pa.array(np.arange(n))})
    keys = [f"k{i}" for i in range(8)]
    assert sorted_by(table, keys).column("row").to_pylist() == _arrow(table, keys)


def test_other_key_types_fall_back_to_arrow() -> None:
    table = pa.table({"d": pa.array([2.5, None, float("nan"), -1.0]),
                      "row": pa.array(np.arange(4))})
    assert sort_order(table, ["d"]) is None
    assert sorted_by(table, ["d"]).column("row").to_pylist() == _arrow(table, ["d"])
