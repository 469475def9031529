"""A hashed slab's order from the rollup (:func:`shuffled.spark.phase1.slabs.with_lead`).

Phase 1 hashes the raw rows' key once and the rollup orders its groups by (chunk,
partition, hash) with the sort it does anyway, so that the cut takes the rows as they come.
What must hold: the slab is the same bytes as when the cut hashed and sorted the rollup's
rows itself (docs/slab.md: rows in (chunk, key) order), through a combine of held tables
too; where the key cannot ride along, nothing changes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shuffled.spark.phase1.config import Keying
from shuffled.spark.phase1.slabs import cut_slab, row_keys, with_lead
from shuffled.spark.rows.grouping import group, key_columns
from shuffled.spark.rows.rollup import (
    CHUNK, LEAD, SMALL, TIME, Layout, combine, rollup_input,
)
from tests.spark.slab.test_shardplan import DAY, LAYOUT, skewed_rows

KEYINGS = [Keying("hashed", (TIME, "country", "device", "user")),
           Keying("hashed", (TIME, "country", "device", "user"), 3),
           Keying("hashed", ("country",), 2)]
IDS = ["hashed", "numShards", "numShards-partitionDimensions"]


def rows(rng: np.random.Generator, n: int, days: int) -> pa.Table:
    """Raw rows whose key codes leave the lead room in one int64 (:func:`.grouping.group`:
    days x 24 hours x 40 x 50 x 1,000 codes beside a 34-bit lead), as comparison 5's do."""
    day = rng.integers(0, days, n) * DAY
    return pa.table({
        CHUNK: pa.array(day, pa.int64()),
        TIME: pa.array(day + rng.integers(0, 24, n) * 3_600_000, pa.int64()),
        "country": pa.array([f"c{c:02d}" for c in rng.integers(0, 40, n).tolist()]),
        "device": pa.array([f"d{d:03d}" for d in rng.integers(0, 50, n).tolist()]),
        "user": pa.array([f"u{u}" for u in rng.integers(0, 1_000, n).tolist()]),
    })


def _cut(table: pa.Table, keying: Keying,
         layout: Layout = LAYOUT) -> tuple[bytes, bytes, bytes]:
    slab, _ = cut_slab(table, layout, keying, "day", sub_task_id="p0", slab_id=0, attempt=0)
    return slab.data.to_pybytes(), slab.index, slab.stats


@pytest.mark.parametrize("keying", KEYINGS, ids=IDS)
def test_the_rollup_orders_a_hashed_slab_as_the_cut_would(keying: Keying) -> None:
    raw = rows(np.random.default_rng(5), SMALL + 20_000, 2)
    plain = rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True)
    led_raw = with_lead(raw, keying, LAYOUT)
    assert led_raw is not None
    led = rollup_input(led_raw, LAYOUT, [CHUNK, LEAD], dictionaries=True)
    assert led.num_rows == plain.num_rows
    _, order = row_keys(led, keying)
    assert order is None  # in the slab's order already: no sort, no take
    _, order = row_keys(plain, keying)
    assert order is not None and not np.array_equal(order, np.arange(len(order)))
    assert _cut(led, keying) == _cut(plain, keying)


@pytest.mark.parametrize("keying", KEYINGS[1:2], ids=IDS[1:2])
def test_a_combine_of_held_tables_keeps_the_order(keying: Keying) -> None:
    """Phase 1 combines the tables it holds before a flush (keys fold across them): the
    combine orders by the lead again, and small tables (Acero's hash group-by, in no
    order) are sorted by the cut from the lead, unhashed."""
    rng = np.random.default_rng(8)
    raws = [rows(rng, SMALL, 2) for _ in range(2)]
    led = [rollup_input(with_lead(r, keying, LAYOUT), LAYOUT, [CHUNK, LEAD],
                        dictionaries=True) for r in raws]
    plain = [rollup_input(r, LAYOUT, [CHUNK], dictionaries=True) for r in raws]
    both = combine(pa.concat_tables(led), LAYOUT, [CHUNK, LEAD], dictionaries=True)
    assert row_keys(both, keying)[1] is None
    assert _cut(both, keying) == _cut(
        combine(pa.concat_tables(plain), LAYOUT, [CHUNK], dictionaries=True), keying)
    small = rows(rng, 5_000, 2)
    few = rollup_input(with_lead(small, keying, LAYOUT), LAYOUT, [CHUNK, LEAD])
    assert _cut(few, keying) == _cut(rollup_input(small, LAYOUT, [CHUNK]), keying)


def test_no_lead_where_the_key_cannot_ride_along() -> None:
    """Range keys, or a hashed column not yet in its slab type (its Spark hash changes
    with the type, so the raw rows' hash would not be the slab's)."""
    raw = skewed_rows(np.random.default_rng(2), 1_000, 2)
    assert with_lead(raw, Keying("range", ("country",)), LAYOUT) is None
    assert with_lead(raw, None, LAYOUT) is None
    as_int = raw.set_column(raw.schema.get_field_index(TIME), TIME,
                            raw.column(TIME).cast(pa.int32(), safe=False))
    assert with_lead(as_int, KEYINGS[1], LAYOUT) is None
    assert with_lead(raw, KEYINGS[1], LAYOUT) is not None


def test_a_lead_without_room_leaves_the_groups_as_they_were() -> None:
    """Where the lead does not fit beside the key's codes in one int64, it is left out:
    the same groups, in the key's order."""
    rng = np.random.default_rng(4)
    n = 50_000
    table = pa.table({"a": pa.array(rng.integers(0, 1 << 40, n)),
                      "b": pa.array(rng.integers(0, 1 << 20, n))})
    cols = key_columns(table, ["a", "b"])
    assert cols is not None
    lead = rng.integers(0, 1 << 33, n).astype(np.uint64)
    with_it, without = group(cols, n, lead=lead), group(cols, n)
    assert np.array_equal(with_it.order, without.order)
    assert np.array_equal(with_it.starts, without.starts)


def test_without_room_the_cut_sorts_by_the_carried_lead() -> None:
    """Keys too wide for the lead (a user id of 28,000 values): the rollup groups as
    before and the cut sorts, from the lead's hash rather than hashing again; the same
    bytes."""
    keying = KEYINGS[1]
    raw = skewed_rows(np.random.default_rng(6), SMALL + 20_000, 3)
    led = rollup_input(with_lead(raw, keying, LAYOUT), LAYOUT, [CHUNK, LEAD],
                       dictionaries=True)
    assert row_keys(led, keying)[1] is not None
    assert _cut(led, keying) == _cut(rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True),
                                     keying)


def _wide(rng: np.random.Generator, n: int) -> pa.Table:
    """Keys of five columns whose codes overflow one int64 (2 x 24 x 6 x 2^16-value
    columns): the mixed key would be ranked by a sort of its own."""
    cols = {CHUNK: pa.array(rng.integers(0, 2, n) * DAY, pa.int64()),
            "hour": pa.array(rng.integers(0, 24, n), pa.int64())}
    for name in ("a", "b", "c", "d"):
        values = rng.integers(0, 1 << 16, n)
        cols[name] = pa.array([f"{name}{v}" for v in values.tolist()]) if name in "ab" \
            else pa.array(values * 7919, pa.int64())
    cols["e"] = pa.array(rng.integers(0, 6, n), pa.int64())
    return pa.table(cols)


@pytest.mark.parametrize("distinct_leads", [1 << 33, 5], ids=["hash", "collisions"])
@pytest.mark.parametrize("stable", [True, False])
def test_a_lead_beside_an_overflowing_key_groups_the_same(distinct_leads: int,
                                                          stable: bool) -> None:
    """Where the key's codes overflow one int64 the rows are sorted by (first column,
    lead) alone and each run of one lead checked column by column: the groups are the
    ones grouping by the key gives, in (first column, lead) order, each group's rows in
    input order when asked to be stable. With five leads nearly every run holds many
    keys (a collision in every run)."""
    rng = np.random.default_rng(distinct_leads % 97 + stable)
    n = 40_000
    table = _wide(rng, n)
    keys = table.column_names
    # A function of the key (equal keys, equal leads): a hash of the row, folded.
    rowhash = np.asarray([hash(t) for t in zip(*(table.column(k).to_pylist() for k in keys))],
                         dtype=np.int64).view(np.uint64)
    lead = rowhash % np.uint64(distinct_leads)
    cols = key_columns(table, keys)
    assert cols is not None
    got, want = group(cols, n, stable=stable, lead=lead), group(cols, n, stable=stable)
    assert got.count == want.count
    gid_got, gid_want = got.gid(), want.gid()
    assert len(set(zip(gid_got.tolist(), gid_want.tolist()))) == want.count  # one to one
    chunk = table.column(CHUNK).to_numpy()[got.order]
    ordered = lead[got.order]
    rising = (chunk[1:] > chunk[:-1]) | ((chunk[1:] == chunk[:-1]) & (ordered[1:] >= ordered[:-1]))
    assert rising.all()
    if stable:
        ends = np.append(got.starts[1:], n)
        for s, e in zip(got.starts[:200], ends[:200], strict=True):
            assert np.all(np.diff(got.order[s:e]) > 0)


def test_wide_keys_cut_the_same_slab_through_the_lead() -> None:
    """Phase 1 on keys too wide for the mixed int64 (five dimensions of ~16,000 values):
    the rollup sorts by the lead alone, and the slab is the same bytes as the cut's own
    sort gives."""
    rng = np.random.default_rng(12)
    n = SMALL + 10_000
    dims = ("a", "b", "c", "d", "e")
    layout = Layout(tuple((d, "string") for d in dims), LAYOUT.metrics)
    keying = Keying("hashed", (TIME, *dims), 3)
    day = rng.integers(0, 2, n) * DAY
    raw = pa.table({
        CHUNK: pa.array(day, pa.int64()),
        TIME: pa.array(day + rng.integers(0, 24, n) * 3_600_000, pa.int64()),
        **{d: pa.array([f"{d}{v}" for v in rng.integers(0, 1 << 14, n).tolist()])
           for d in dims},
    })
    raw = pa.concat_tables([raw, raw.slice(0, 20_000)])  # keys that fold
    led = rollup_input(with_lead(raw, keying, layout), layout, [CHUNK, LEAD],
                       dictionaries=True)
    assert led.num_rows == n
    assert row_keys(led, keying)[1] is None
    assert _cut(led, keying, layout) == _cut(
        rollup_input(raw, layout, [CHUNK], dictionaries=True), keying, layout)


def test_plain_strings_of_the_key_come_back_encoded_once() -> None:
    """Text input's strings are plain: the lead's hash encodes each once, and the rollup
    groups by that dictionary as it is (encoding them again cost JSON input's rollup 15%).
    The values are unchanged."""
    raw = rows(np.random.default_rng(9), 5_000, 2)
    led = with_lead(raw, KEYINGS[1], LAYOUT)
    assert led is not None
    for name in ("country", "device", "user"):
        assert pa.types.is_dictionary(led.column(name).type)
        assert led.column(name).cast(pa.string()).equals(raw.column(name))
    assert led.column(TIME).equals(raw.column(TIME))
