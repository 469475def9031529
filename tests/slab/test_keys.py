"""Range keys computed once per distinct tuple (``keys.distinct_tuple_keys``) and phase 1's
bottom-k sample, each checked against the row-by-row definition they replace
(``keys.encode_tuple``: the encoding docs/slab.md specifies)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.slab import keys
from shuffled.spark.phase1 import slabs


def _columns(rng: np.random.Generator, n: int, cardinality: int, count: int) -> list[pa.Array]:
    cols = []
    for c in range(count):
        values = [None if v == 0 else f"v{v}\x00{c}" if v % 7 == 0 else f"é{v}"
                  for v in rng.integers(0, cardinality, n)]
        arr = pa.array(values, pa.string())
        cols.append(arr.dictionary_encode() if c % 2 else arr)
    return cols


# (3000, 40, 2): codes counted in a table; (3000, 1000, 2): too sparse for one, sorted;
# 7 columns: the code would overflow, and is renumbered on the way.
@pytest.mark.parametrize("n,cardinality,count", [(0, 5, 2), (1, 5, 1), (3000, 40, 2),
                                                 (3000, 1000, 2), (3000, 1000, 7)])
def test_distinct_keys_are_the_row_by_row_encoding(n: int, cardinality: int, count: int) -> None:
    rng = np.random.default_rng(n + count)
    cols = _columns(rng, n, cardinality, count)
    distinct, row, rank = keys.distinct_tuple_keys(cols)
    rows = [tuple(c[i].as_py() for c in cols) for i in range(n)]
    assert distinct.take(pa.array(row, pa.int64())).to_pylist() == \
        [keys.encode_tuple(t) for t in rows]
    assert len(set(distinct.to_pylist())) == len(distinct)  # distinct indeed
    assert [distinct[int(i)].as_py() for i in np.argsort(rank)] == sorted(distinct.to_pylist())


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


@pytest.mark.parametrize(("lo", "hi", "width", "pieces"), [
    (None, None, 4, 7),
    ((3 << 32).to_bytes(8, "big"), (4 << 32).to_bytes(8, "big"), 8, 50),
    ((1 << 30).to_bytes(4, "big"), None, 4, 3),
    ((5).to_bytes(4, "big"), (7).to_bytes(4, "big"), 4, 10),  # narrower than the pieces
])
def test_a_key_range_cut_in_pages_holds_each_key_once(lo: bytes | None, hi: bytes | None,
                                                       width: int, pieces: int) -> None:
    """slab.keys.split_range (phase 2's pages of a large hashed shard): consecutive
    ranges, the outer bounds as given, every key of [lo, hi) in exactly one."""
    ranges = keys.split_range(lo, hi, pieces, width)
    assert ranges[0][0] == lo and ranges[-1][1] == hi
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert len(ranges) in (1, pieces)
    rng = np.random.default_rng(1)
    a = 0 if lo is None else int.from_bytes(lo, "big")
    b = (1 << (8 * width)) if hi is None else int.from_bytes(hi, "big")
    for v in [a, b - 1, *rng.integers(a, b, 200, dtype=np.uint64).tolist()]:
        k = int(v).to_bytes(width, "big")
        assert sum((x is None or k >= x) and (y is None or k < y) for x, y in ranges) == 1


def test_partition_keys_fall_in_their_partitions_range() -> None:
    """numShards' slab keys, (partition, hash) as 8 bytes: partition i is the key range
    shardplan.partition_bounds gives it, whatever the hash."""
    from shuffled.spark.phase2.shardplan import partition_bounds

    rng = np.random.default_rng(2)
    part = rng.integers(0, 5, 1000)
    h = rng.integers(0, 1 << 32, 1000, dtype=np.uint64).astype(np.uint32)
    h[:2] = [0, (1 << 32) - 1]
    got = keys.partition_hash_keys(part, h).to_pylist()
    bounds = partition_bounds(5)
    for p, k in zip(part.tolist(), got):
        lo, hi = bounds[p]
        assert lo is not None and hi is not None and lo <= k < hi


@pytest.mark.parametrize("spread", [1, 86_400_000, 1 << 40], ids=["dense", "days", "wide"])
def test_chunk_key_order_is_sort_indices_of_the_pair(spread: int) -> None:
    """The stable order by (chunk, key), as Arrow sorts the pair (nulls last, ties in row
    order), whether the chunks pack beside the key's rank in one integer or not."""
    rng = np.random.default_rng(spread % 97)
    n = 3000
    chunks = rng.integers(0, 40, n).astype(np.int64) * spread + 1_262_304_000_000
    words = [None, b"", b"a", b"a\x00", b"ab", b"b", b"\xff"]
    values = pa.array([words[i] for i in rng.integers(0, len(words), n)], pa.binary())
    want = pc.sort_indices(pa.table({"c": pa.array(chunks), "k": values}),
                           sort_keys=[("c", "ascending"), ("k", "ascending")])
    assert keys.chunk_key_order(chunks, values).tolist() == want.to_pylist()
