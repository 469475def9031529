"""Phase 2's merge of a batch of slab shards (docs/slab.md): a shard's rows come from several
slabs, each rolled up on its own, so a group key can arrive once per slab and must come out
once, its metrics combined (Druid's perfect rollup: one row per time and dimension values,
https://druid.apache.org/docs/latest/ingestion/rollup). Rows whose key hashes all differ
cannot share a key and are only sorted; the others are sorted, and their runs of equal keys
grouped. Either way each shard's rows must equal a plain dictionary rollup of its input,
sorted by time then dimensions with nulls first (as Druid sorts a segment)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.slab.keys import KEY_COLUMN, partition_hash_keys
from shuffled.spark.phase1.slabs import hash_values
from shuffled.spark.phase2.merge import merge_partitions
from shuffled.spark.phase2.slabmerge import _distinct, _merged
from shuffled.spark.rows.rollup import TIME, Layout, combine

LAYOUT = Layout((("country", "string"), ("city", "string")),
                (("count", "count", "sum", "long", None), ("clicks", "sum", "sum", "long", "c"),
                 ("top", "max", "max", "long", "t")))
COLUMNS = [TIME, "country", "city", "count", "clicks", "top"]


def _slab(rows: list[tuple[Any, ...]], hashes: np.ndarray | None = None) -> pa.Table:
    """One slab's rows of a shard (each key once: a slab is rolled up), with ``__key``
    as phase 1 makes it for numShards (partition 0, Spark's hash of time and dimensions)."""
    t = pa.Table.from_pylist([dict(zip(COLUMNS, r, strict=True)) for r in rows],
                             LAYOUT.schema())
    h = hash_values(t, (TIME, "country", "city")) if hashes is None else hashes
    order = np.argsort(h, kind="stable")
    t = t.take(pa.array(order))
    return t.append_column(KEY_COLUMN, partition_hash_keys(np.zeros(len(h), np.int64),
                                                           np.asarray(h)[order]))


def _rollup(slabs: list[pa.Table]) -> list[tuple[Any, ...]]:
    """The reference: a dictionary keyed by (time, dimensions), metrics combined."""
    out: dict[tuple[Any, ...], list[int]] = {}
    for t in slabs:
        for r in t.select(COLUMNS).to_pylist():
            key = (r[TIME], r["country"], r["city"])
            if key in out:
                acc = out[key]
                out[key] = [acc[0] + r["count"], acc[1] + r["clicks"], max(acc[2], r["top"])]
            else:
                out[key] = [r["count"], r["clicks"], r["top"]]
    return sorted(((*k, *v) for k, v in out.items()),
                  key=lambda r: tuple((x is not None, x) for x in r[:3]))


def _rows(n: int, seed: int, start: int = 0) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(seed)
    return [(3600_000 * int(rng.integers(0, 3)), f"c{start + i}",
             None if i % 7 == 0 else f"city{i % 5}", int(rng.integers(1, 4)),
             int(rng.integers(0, 100)), int(rng.integers(0, 1000))) for i in range(n)]


def test_a_batch_merges_each_shard_to_its_rollup_by_either_path() -> None:
    disjoint = [_slab(_rows(40, 1, 0)), _slab(_rows(30, 2, 1000)), _slab(_rows(25, 3, 2000))]
    same = _rows(40, 4)  # the same keys in two slabs, metrics differing
    overlapping = [_slab(same), _slab([(*r[:3], 1, 5, 7) for r in same]),
                   _slab(_rows(10, 5, 5000))]
    # Two different keys given one hash (a collision): not the same key, both rows kept.
    a, b = _rows(2, 6, 9000)
    collided = [_slab([a], np.array([42], np.uint32)), _slab([b], np.array([42], np.uint32))]
    parts = [disjoint, overlapping, collided, [_slab(_rows(5, 7, 7000))]]
    assert _distinct(parts) == [True, False, False, True]
    merged = _merged(parts, LAYOUT, lambda t: t)
    assert len(merged) == len(parts)
    for tables, out in zip(parts, merged, strict=True):
        assert KEY_COLUMN not in out.column_names
        assert [tuple(r.values()) for r in out.select(COLUMNS).to_pylist()] == _rollup(tables)
    assert merged[1].num_rows == 50  # 40 keys twice, rolled up once each, and 10 more


def test_range_keys_always_group() -> None:
    """A range slab's ``__key`` is its partition dimensions' tuple, not a hash of the whole
    key: no shard of such rows is taken as distinct."""
    t = _slab(_rows(20, 8)).drop_columns([KEY_COLUMN])
    ranged = t.append_column(KEY_COLUMN, pa.array([b"\x01" + bytes(str(i), "ascii") * (i % 3 + 1)
                                                   for i in range(t.num_rows)], pa.binary()))
    assert _distinct([[ranged, ranged]]) == [False]
    [out] = _merged([[ranged, ranged]], LAYOUT, lambda x: x)
    want = _rollup([t, t])
    assert [tuple(r.values()) for r in out.select(COLUMNS).to_pylist()] == want


def test_floating_dimensions_merge_as_the_group_by_does() -> None:
    """The group-by keeps -0.0 and 0.0 (and NaNs of other bits) apart, as their hashes
    do: the sorted-only path gives what grouping gives."""
    layout = Layout((("x", "double"),), (("count", "count", "sum", "long", None),))
    bits = np.array([np.nan, np.nan, -0.0, 0.0, 1.5]).view(np.uint64).copy()
    bits[1] |= np.uint64(1)
    x = pa.array(bits.view(np.float64))
    t = pa.table({TIME: pa.array([0] * 5, pa.int64()), "x": x,
                  "count": pa.array([1] * 5, pa.int64())})
    h = hash_values(t, (TIME, "x"))

    def keyed(rows: pa.Table, hashes: np.ndarray) -> pa.Table:
        return rows.append_column(KEY_COLUMN, partition_hash_keys(
            np.zeros(len(hashes), np.int64), hashes))

    parts = [[keyed(t, h), keyed(t.slice(4, 1), h[4:])]]  # 1.5 twice: grouped
    alone = [[keyed(t, h)]]  # each value once
    assert _distinct(alone) == [len(set(h.tolist())) == 5]
    for p in (parts, alone):
        [got] = _merged(p, layout, lambda x: x)
        [want] = merge_partitions([[x.drop_columns([KEY_COLUMN]) for x in p[0]]], layout)
        assert got.num_rows == want.num_rows
        assert sorted(map(str, got.to_pylist())) == sorted(map(str, want.to_pylist()))


def _ranged(t: pa.Table) -> pa.Table:
    """``t`` keyed as a range slab: its partition tuple, which many rows share."""
    t = t.drop_columns([KEY_COLUMN])
    return t.append_column(KEY_COLUMN, pa.array(
        [b"\x01" + (c or "").encode() for c in t.column("country").to_pylist()], pa.binary()))


def test_range_rows_are_sorted_and_only_their_repeats_grouped(monkeypatch: Any) -> None:
    """A range key cannot prove a shard's rows distinct. Each slab's run is rolled up on
    its own, so a key repeats only across slabs: the rows are sorted, and the group-by
    sees only the runs of equal keys the sort puts side by side. Every shard still comes
    out as its rollup."""
    one, other = _ranged(_slab(_rows(20, 8))), _ranged(_slab(_rows(15, 9, 3000)))
    parts = [[one, other], [one, one]]
    assert _distinct(parts) == [False, False]
    seen = _grouped_rows(monkeypatch)
    for tables, out in zip(parts, _merged(parts, LAYOUT, lambda t: t), strict=True):
        assert [tuple(r.values()) for r in out.select(COLUMNS).to_pylist()] == _rollup(tables)
    assert seen == [40]  # the 20 keys of [one, one], twice each; none of [one, other]


def _grouped_rows(monkeypatch: Any) -> list[int]:
    """The rows of each group-by the merge runs, as they run."""
    seen: list[int] = []

    def counted(table: pa.Table, *args: Any, **kwargs: Any) -> pa.Table:
        seen.append(table.num_rows)
        return combine(table, *args, **kwargs)

    monkeypatch.setattr("shuffled.spark.phase2.merge.combine", counted)
    return seen


def test_runs_across_shards_are_not_folded(monkeypatch: Any) -> None:
    """Two shards of a batch holding the same key each keep their row, and nothing is
    grouped: a run is of equal keys within one shard."""
    a = _ranged(_slab(_rows(1, 10)))  # its last row beside the next shard's first
    parts = [[a], [a], [a, _ranged(_slab(_rows(3, 11, 500)))]]
    seen = _grouped_rows(monkeypatch)
    merged = _merged(parts, LAYOUT, lambda t: t)
    for tables, out in zip(parts, merged, strict=True):
        assert [tuple(r.values()) for r in out.select(COLUMNS).to_pylist()] == _rollup(tables)
    assert seen == []


_KEYS = st.tuples(st.sampled_from([0, 3600_000]), st.sampled_from(["a", "b", None]),
                  st.sampled_from(["x", "y", "z", None]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.lists(_KEYS, max_size=8, unique=True), min_size=1, max_size=3),
                min_size=1, max_size=4),
       st.integers(0, 2**32 - 1))
def test_folding_runs_gives_the_rollup(shards: list[list[list[tuple[Any, ...]]]],
                                       seed: int) -> None:
    """Any batch of range shards (each slab's keys distinct, as a rolled-up slab's are,
    repeating across slabs and shards, nulls among them) merges to the reference rollup:
    one row per time and dimension values, its metrics summed or maxed."""
    rng = np.random.default_rng(seed)
    parts = [[_ranged(_slab([(*k, int(rng.integers(1, 4)), int(rng.integers(0, 9)),
                              int(rng.integers(0, 99))) for k in keys]))
              for keys in slabs] for slabs in shards]
    for tables, out in zip(parts, _merged(parts, LAYOUT, lambda t: t), strict=True):
        assert [tuple(r.values()) for r in out.select(COLUMNS).to_pylist()] == _rollup(tables)


def test_folded_runs_keep_first_and_last_by_their_times() -> None:
    """A run folded in place combines first/last metrics as Druid's longFirst/longLast
    do (https://druid.apache.org/docs/latest/querying/aggregations#first-and-last-
    aggregators): the value with the earliest, or latest, time of its rows."""
    layout = Layout((("d", "string"),),
                    (("v", "longLast", "last", "long", "v"), ("f", "longFirst", "first", "long", "f")))
    times = iter(range(1000, 0, -7))  # every row a time of its own: no ties to break

    def slab(keys: list[str | None]) -> pa.Table:
        rows = [{TIME: 0, "d": k, "v": i, "f": i, layout.hidden[0]: next(times),
                 layout.hidden[1]: next(times)} for i, k in enumerate(keys)]
        t = pa.Table.from_pylist(rows, layout.schema())
        return t.append_column(KEY_COLUMN, pa.array([b"\x01" + (k or "").encode()
                                                     for k in keys], pa.binary()))

    parts = [[slab(["a", "b", None]), slab(["b", "c"]), slab([None, "b"])]]
    [out] = _merged(parts, layout, lambda t: t)
    want: dict[str | None, dict[str, tuple[int, int]]] = {}
    for t in parts[0]:
        for r in t.to_pylist():
            got = want.setdefault(r["d"], {"v": (-1, 0), "f": (1 << 40, 0)})
            got["v"] = max(got["v"], (r[layout.hidden[0]], r["v"]))
            got["f"] = min(got["f"], (r[layout.hidden[1]], r["f"]))
    assert [(r["d"], r["v"], r["f"]) for r in out.to_pylist()] == [
        (k, want[k]["v"][1], want[k]["f"][1]) for k in [None, "a", "b", "c"]]
