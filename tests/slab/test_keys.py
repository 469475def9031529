"""Range keys computed once per distinct tuple (``keys.distinct_tuple_keys``), a slab's
per-chunk key sample (``sketch.sample``) and phase 1's bottom-k sample, each checked
against the row-by-row definition they replace (``keys.encode_tuple``: the encoding
docs/slab.md specifies; a uniform draw of at most ``size`` keys per chunk)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shuffled.slab import keys, sketch
from shuffled.spark.phase1 import slabs


def _columns(rng: np.random.Generator, n: int, cardinality: int, count: int) -> list[pa.Array]:
    cols = []
    for c in range(count):
        values = [None if v == 0 else f"v{v}\x00{c}" if v % 7 == 0 else f"é{v}"
                  for v in rng.integers(0, cardinality, n)]
        arr = pa.array(values, pa.string())
        cols.append(arr.dictionary_encode() if c % 2 else arr)
    return cols


@pytest.mark.parametrize("n,cardinality,count", [(0, 5, 2), (1, 5, 1), (3000, 40, 2),
                                                 (3000, 1000, 7)])  # 7: the code overflows
def test_distinct_keys_are_the_row_by_row_encoding(n: int, cardinality: int, count: int) -> None:
    rng = np.random.default_rng(n + count)
    cols = _columns(rng, n, cardinality, count)
    distinct, row, rank = keys.distinct_tuple_keys(cols)
    rows = [tuple(c[i].as_py() for c in cols) for i in range(n)]
    assert distinct.take(pa.array(row, pa.int64())).to_pylist() == \
        [keys.encode_tuple(t) for t in rows]
    assert len(set(distinct.to_pylist())) == len(distinct)  # distinct indeed
    assert [distinct[int(i)].as_py() for i in np.argsort(rank)] == sorted(distinct.to_pylist())


def test_a_chunk_sample_keeps_small_chunks_whole_and_draws_from_large_ones() -> None:
    rng = np.random.default_rng(3)
    bounds = np.array([0, 10, 10, 5000, 5003])
    values = pa.array([f"k{i}".encode() for i in range(5003)], pa.binary())
    got = sketch.sample(values, bounds, rng, size=100).to_pylist()
    assert got[0] == values.slice(0, 10).to_pylist() and got[1] == []
    assert got[3] == values.slice(5000, 3).to_pylist()
    big = got[2]
    assert len(big) == 100 == len(set(big))
    members = set(values.slice(10, 4990).to_pylist())
    assert set(big) <= members
    assert big == sorted(big, key=lambda k: int(k[1:]))  # in the chunk's order
    # The same draw as one rng.choice over the chunk (a rerun samples alike).
    again = sketch.sample(values, bounds, np.random.default_rng(3), size=100).to_pylist()
    assert again == got


def test_bottom_k_keeps_small_chunks_in_key_order_and_ranks_large_ones() -> None:
    chunks = np.repeat(np.array([0, 1, 2], np.int64), [5, 3, 7])
    hashes = np.arange(15, 0, -1).astype(np.uint64)
    ks = pa.array([f"{i:02}".encode() for i in range(15)], pa.binary())
    small = slabs.bottom_k(chunks, hashes, ks, k=7, in_key_order=True)
    assert small.in_key_order and small.keys.to_pylist() == ks.to_pylist()
    # Not said to be in key order, the rows are ranked (the plan sorts them by key).
    assert not slabs.bottom_k(chunks, hashes, ks, k=7).in_key_order
    ranked = slabs.bottom_k(chunks, hashes, ks, k=4, in_key_order=True)
    assert not ranked.in_key_order
    per_chunk = {c: sorted(h for cc, h in zip(ranked.chunks, ranked.hashes) if cc == c)
                 for c in (0, 1, 2)}
    assert per_chunk == {0: [11, 12, 13, 14], 1: [8, 9, 10], 2: [1, 2, 3, 4]}
