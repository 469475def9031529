"""The bounded-memory partition merge (:mod:`shuffled.spark.phase2.spill`): its output equals
the in-memory merge, in order, for skewed and constant keys, nulls and rollup off, with
nothing left in the spill directory."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.spark.phase2.spill import merge_bounded, merge_in_memory
from shuffled.spark.rows.rollup import TIME, Layout

LAYOUT = Layout((("a", "string"), ("b", "long")),
                (("cnt", "count", "sum", "long", None), ("s", "sum", "sum", "double", "__m1")))


def _rows(n: int, times: int, a_values: int, seed: int, null_every: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    a = [f"v{x:04d}" for x in rng.integers(0, a_values, n)]
    if null_every:
        a = [None if i % null_every == 0 else v for i, v in enumerate(a)]
    return pa.table({TIME: pa.array(rng.integers(0, times, n) * 3_600_000, pa.int64()),
                     "a": pa.array(a, pa.string()),
                     "b": pa.array(rng.integers(0, 5, n), pa.int64()),
                     "cnt": pa.array(np.ones(n, dtype=np.int64)),
                     "s": pa.array(rng.random(n))})


def _bounded(table: pa.Table, layout: Layout, budget: int, spill_dir: str,
             chunk: int = 997) -> tuple[pa.Table, object]:
    out: list[pa.Table] = []
    stats = merge_bounded(table.to_batches(max_chunksize=chunk), layout, budget, out.append,
                          spill_dir)
    assert os.listdir(spill_dir) == []  # spill files and their directory are gone
    return pa.concat_tables(out) if out else layout.schema().empty_table(), stats


def _same(got: pa.Table, want: pa.Table) -> None:
    assert got.num_rows == want.num_rows
    for name in want.column_names:  # same order, not only the same rows
        g, w = got.column(name).to_pylist(), want.column(name).to_pylist()
        if name == "s":
            assert np.allclose(g, w)
        else:
            assert g == w, name


@pytest.mark.parametrize("times,a_values,null_every", [
    (500, 50, 0),     # many times: split by time only
    (1, 3000, 0),     # one time: split by the first dimension
    (1, 1, 0),        # one key: folds batch by batch
    (3, 2000, 7),     # nulls in the split dimension sort first
])
def test_bounded_equals_in_memory(tmp_path, times: int, a_values: int, null_every: int) -> None:
    table = _rows(60_000, times, a_values, seed=times + a_values, null_every=null_every)
    want = merge_in_memory([table], LAYOUT)
    got, stats = _bounded(table, LAYOUT, 1 << 18, str(tmp_path))
    assert stats.files > 1  # it really spilled: the table is several times the budget
    _same(got, want)


def test_rollup_off_keeps_every_row_in_order(tmp_path) -> None:
    layout = Layout(LAYOUT.dims, LAYOUT.metrics, rollup=False)
    table = _rows(40_000, 2, 1, seed=3)
    got, stats = _bounded(table, layout, 1 << 18, str(tmp_path))
    assert stats.files > 1 and got.num_rows == 40_000
    keys = list(zip(got.column(TIME).to_pylist(), got.column("a").to_pylist(),
                    got.column("b").to_pylist()))
    assert keys == sorted(keys)


def test_fits_in_memory_spills_nothing(tmp_path) -> None:
    table = _rows(2_000, 10, 10, seed=1)
    got, stats = _bounded(table, LAYOUT, 64 << 20, str(tmp_path))
    assert stats.files == 0
    _same(got, merge_in_memory([table], LAYOUT))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 300), st.integers(0, 2**31), st.integers(50, 4000))
def test_bounded_property(tmp_path_factory, times: int, a_values: int, seed: int,
                          chunk: int) -> None:
    table = _rows(20_000, times, a_values, seed=seed, null_every=seed % 5)
    got, _ = _bounded(table, LAYOUT, 1 << 17, str(tmp_path_factory.mktemp("spill")), chunk)
    _same(got, merge_in_memory([table], LAYOUT))
