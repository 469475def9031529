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
from shuffled.spark.rows.rollup import CHUNK, LEAD, SMALL, TIME, combine, rollup_input
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


def _cut(table: pa.Table, keying: Keying) -> tuple[bytes, bytes, bytes]:
    slab, _ = cut_slab(table, LAYOUT, keying, "day", sub_task_id="p0", slab_id=0, attempt=0)
    return slab.data.to_pybytes(), slab.index, slab.stats


@pytest.mark.parametrize("keying", KEYINGS, ids=IDS)
def test_the_rollup_orders_a_hashed_slab_as_the_cut_would(keying: Keying) -> None:
    raw = rows(np.random.default_rng(5), SMALL + 20_000, 2)
    plain = rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True)
    led_raw = with_lead(raw, keying, LAYOUT)
    assert led_raw is not None
    led = rollup_input(led_raw, LAYOUT, [CHUNK, LEAD], dictionaries=True)
    assert led.num_rows == plain.num_rows
    _, order, _ = row_keys(led, keying, LAYOUT)
    assert order is None  # in the slab's order already: no sort, no take
    _, order, _ = row_keys(plain, keying, LAYOUT)
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
    assert row_keys(both, keying, LAYOUT)[1] is None
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
    assert row_keys(led, keying, LAYOUT)[1] is not None
    assert _cut(led, keying) == _cut(rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True),
                                     keying)
