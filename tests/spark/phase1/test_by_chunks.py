"""A flush is cut into slabs of at most SLAB_CHUNKS time chunks (phase1.tasks.by_chunks):
every row exactly once, no piece over the limit, a chunk never split across pieces; rows
already in chunk order go as slices of the flush, not copies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shuffled.spark.phase1.tasks import by_chunks
from shuffled.spark.rows.rollup import CHUNK


def _flush(chunks: np.ndarray) -> pa.Table:
    return pa.table({CHUNK: pa.array(chunks, pa.int64()),
                     "dim": pa.array([f"d{i % 17}" for i in range(len(chunks))]),
                     "n": pa.array(np.arange(len(chunks)), pa.int64())})


def _check(table: pa.Table, most: int) -> list[pa.Table]:
    pieces = list(by_chunks(table, most))
    seen = [set(p.column(CHUNK).to_pylist()) for p in pieces]
    assert all(0 < len(s) <= most for s in seen)
    assert sum(len(s) for s in seen) == len(set().union(*seen))  # no chunk in two pieces
    assert sorted(n for p in pieces for n in p.column("n").to_pylist()) == \
        list(range(table.num_rows))
    return pieces


@pytest.mark.parametrize("most", [1, 3, 10, 1024])
def test_rows_in_chunk_order_go_as_slices(most: int) -> None:
    rng = np.random.default_rng(1)
    chunks = np.sort(rng.integers(0, 40, 2_000)) * 86_400_000
    table = _flush(chunks)
    pieces = _check(table, most)
    assert pa.concat_tables(pieces).equals(table)  # in order
    base = table.column("dim").chunks[0].buffers()[2].address
    size = table.column("dim").chunks[0].buffers()[2].size
    for p in pieces:  # views of the flush's buffers: nothing copied
        at = p.column("dim").chunks[0].buffers()[2].address
        assert base <= at < base + size
    if most >= 40:
        assert pieces == [table]


@pytest.mark.parametrize("most", [1, 3, 10])
def test_rows_out_of_chunk_order_are_still_cut_by_chunk(most: int) -> None:
    rng = np.random.default_rng(2)
    runs = [np.sort(rng.integers(0, 40, 700)) for _ in range(3)]  # held tables side by side
    _check(_flush(np.concatenate(runs) * 3_600_000), most)


def test_an_empty_flush_is_one_empty_piece() -> None:
    table = _flush(np.zeros(0, np.int64))
    assert [p.num_rows for p in by_chunks(table, 4)] == [0]
