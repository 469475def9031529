"""A range-keyed slab's order from the rollup (``order_by`` of
:func:`shuffled.spark.rows.rollup.rollup_input`, set by phase 1's task for a range key on
string dimensions).

docs/slab.md: a slab's rows are in (chunk, key) order, a range key being the partition
dimensions' tuple, nulls first, compared value by value. The rollup sorts its groups
anyway; ordered by the partition dimensions' values right after the chunk, they come out
in that order and the cut takes them as they come. What must hold: the slab is the same
bytes as when the cut sorted the rollup's rows itself, through a combine of held tables
too, with nulls, empty strings, prefixes, NUL bytes and non-ASCII values in the key; and
where the order cannot come from the rollup, the cut still sorts.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.slab.keys import tuple_keys
from shuffled.spark.phase1.config import Keying
from shuffled.spark.phase1.slabs import ROW_HASH, cut_slab, row_keys, with_row_hashes
from shuffled.spark.rows.grouping import group, key_columns
from shuffled.spark.rows.rollup import CHUNK, SMALL, TIME, Layout, combine, rollup_input
from tests.spark.slab.test_shardplan import DAY

# Values whose byte order is easy to get wrong: the empty string before any other, a
# prefix before its extensions, a NUL byte inside a value, UTF-8 beyond ASCII, upper case
# before lower, and null (first of all).
WORDS = ["", "a", "a\x00", "a\x00b", "aa", "ab", "Z", "z", "é", "ä", "日本", None]
LAYOUT = Layout((("country", "string"), ("city", "string"), ("user", "string"),
                 ("n", "long")),
                (("count", "count", "sum", "long", None),))
KEYINGS = [Keying("range", ("country", "city")), Keying("range", ("city",)),
           Keying("range", ("city", "country"), sample_rate=0.25)]


def rows(rng: np.random.Generator, n: int, days: int) -> pa.Table:
    day = rng.integers(0, days, n) * DAY
    pick = rng.integers(0, len(WORDS), (2, n)).tolist()
    return pa.table({
        CHUNK: pa.array(day, pa.int64()),
        TIME: pa.array(day + rng.integers(0, 24, n) * 3_600_000, pa.int64()),
        "country": pa.array([WORDS[i] for i in pick[0]]),
        "city": pa.array([WORDS[i] for i in pick[1]]).dictionary_encode(),
        "user": pa.array([f"u{u}" for u in rng.integers(0, 300, n).tolist()]),
        "n": pa.array(rng.integers(-50, 50, n), pa.int64()),
    })


def _cut(table: pa.Table, keying: Keying) -> tuple[bytes, bytes, bytes, list[bytes]]:
    slab, sample = cut_slab(table, LAYOUT, keying, "day", sub_task_id="p0", slab_id=0,
                            attempt=0)
    assert sample is not None
    return (slab.data.to_pybytes(), slab.index, slab.stats,
            sample.keys.to_pylist())  # type: ignore[return-value]


def _in_key_order(table: pa.Table, keying: Keying) -> bool:
    """Whether the rows are in (chunk, tuple key) order, by Arrow's own sort of the
    slab format's key bytes (not by the code under test)."""
    keys = tuple_keys([table.column(c) for c in keying.columns])
    pair = pa.table({"c": table.column(CHUNK), "k": keys})
    order = pc.sort_indices(pair, [("c", "ascending"), ("k", "ascending")]).to_numpy()
    sorted_pair = pair.take(pa.array(order))
    return sorted_pair.equals(pair)


@pytest.mark.parametrize("keying", KEYINGS, ids=["two", "one", "reversed-sampled"])
def test_the_rollup_orders_a_range_slab_as_the_cut_would(keying: Keying) -> None:
    raw = rows(np.random.default_rng(3), SMALL + 30_000, 3)
    plain = rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True)
    ordered = rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True,
                           order_by=keying.columns)
    assert ordered.num_rows == plain.num_rows
    assert _in_key_order(ordered, keying) and not _in_key_order(plain, keying)
    assert row_keys(ordered, keying)[1] is None  # no sort, no take
    order = row_keys(plain, keying)[1]
    assert order is not None and not np.array_equal(order, np.arange(len(order)))
    assert _cut(ordered, keying) == _cut(plain, keying)


def test_a_combine_of_held_tables_keeps_the_order() -> None:
    """Held tables are combined before a flush (their dictionaries unified, so the ranks
    are taken again); small ones (Acero's hash group-by, in no order) are sorted by the
    cut."""
    keying = KEYINGS[0]
    rng = np.random.default_rng(8)
    raws = [rows(rng, SMALL, 2) for _ in range(2)]
    held = [rollup_input(r, LAYOUT, [CHUNK], dictionaries=True, order_by=keying.columns)
            for r in raws]
    both = combine(pa.concat_tables(held), LAYOUT, [CHUNK], dictionaries=True,
                   order_by=keying.columns)
    assert row_keys(both, keying)[1] is None
    plain = combine(pa.concat_tables(held), LAYOUT, [CHUNK], dictionaries=True)
    assert _cut(both, keying) == _cut(plain, keying)
    small = rows(rng, 5_000, 2)
    few = rollup_input(small, LAYOUT, [CHUNK], order_by=keying.columns)
    assert _cut(few, keying) == _cut(rollup_input(small, LAYOUT, [CHUNK]), keying)


def test_a_key_of_another_type_is_sorted_by_the_cut() -> None:
    """A long in the key: the slab orders it by its text (the key's encoding), which its
    numeric order is not; the cut finds the rows out of order and sorts them."""
    keying = Keying("range", ("n", "country"))
    raw = rows(np.random.default_rng(5), SMALL + 5_000, 2)
    ordered = rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True, order_by=keying.columns)
    assert row_keys(ordered, keying)[1] is not None
    assert _cut(ordered, keying) == _cut(
        rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True), keying)


@pytest.mark.parametrize("stable", [True, False])
def test_ordered_groups_are_the_same_groups(stable: bool) -> None:
    """Ordering by some columns' values changes the groups' order only: one to one with
    the groups of the plain grouping, each group's rows in input order when stable."""
    raw = rows(np.random.default_rng(11), 40_000, 2)
    keys = [CHUNK, TIME, "country", "city", "user"]
    cols = key_columns(raw, keys)
    assert cols is not None
    got = group(cols, raw.num_rows, stable=stable, ordered=(3, 2))
    want = group(cols, raw.num_rows, stable=stable)
    assert got.count == want.count
    pairs = set(zip(got.gid().tolist(), want.gid().tolist()))
    assert len(pairs) == want.count
    if stable:
        ends = np.append(got.starts[1:], raw.num_rows)
        for s, e in zip(got.starts[:300], ends[:300], strict=True):
            assert np.all(np.diff(got.order[s:e]) > 0)


def test_a_phase1_task_asks_its_rollup_for_the_slab_order() -> None:
    """The wiring: a phase-1 task keyed by range on string dimensions rolls up and
    combines its held tables in the slab's order (nothing for the cut to sort); keyed by
    a long, or hashed, it asks for no order (the lead, or the cut, orders those)."""
    from dataclasses import replace

    from shuffled.spark.phase1.config import Phase1Config
    from shuffled.spark.phase1.tasks import _Task
    from shuffled.spark.rows.rollup import BAD

    keying = KEYINGS[0]
    cfg = Phase1Config("order", ("http://127.0.0.1:9",), LAYOUT, "day", 10 * SMALL, 5,
                       slabs=keying)
    rng = np.random.default_rng(17)
    task = _Task(cfg, bucketer=lambda table: None)  # type: ignore[arg-type]
    try:
        assert task.order_by == keying.columns
        for _ in range(2):  # two held tables, combined as a flush would
            raw = rows(rng, SMALL + 10_000, 3)
            task.add(raw.append_column(BAD, pa.nulls(raw.num_rows, pa.string())))
            task._rollup_raw_only()
        assert len(task.pending) == 2
        assert row_keys(task._pending_table(), keying)[1] is None
    finally:
        task.close()
    for other in (Keying("range", ("n", "country")), Keying("hashed", ("country",), 2)):
        task = _Task(replace(cfg, slabs=other), bucketer=lambda table: None)  # type: ignore[arg-type]
        try:
            assert task.order_by == ()
        finally:
            task.close()


@pytest.mark.parametrize("keying", [KEYINGS[0], Keying("hashed", ("country", "city")),
                                    Keying("hashed", ("country", "city"), num_shards=3)],
                         ids=["range", "hashed", "hashed-numShards"])
def test_each_slab_row_carries_its_own_key(keying: Keying) -> None:
    """The cut sorts rows the rollup left out of order and makes their keys in the slab's
    order (row_keys): each row's ``__key`` is the key of its own columns, encoded again
    here from the slab's rows."""
    from shuffled.slab.keys import hash_keys, partition_hash_keys
    from shuffled.spark.phase1.slabs import _partition_of, hash_values
    from tests.helpers.slab_decode import decode

    plain = rollup_input(rows(np.random.default_rng(21), 20_000, 3), LAYOUT, [CHUNK],
                         dictionaries=True)
    assert row_keys(plain, keying)[1] is not None  # the cut sorts: keys in its order
    slab, _ = cut_slab(plain, LAYOUT, keying, "day", sub_task_id="p0", slab_id=0, attempt=0)
    data = decode(slab).data
    if keying.kind == "range":
        want = tuple_keys([data.column(c) for c in keying.columns])
    else:
        h = hash_values(data, keying.columns)
        want = (partition_hash_keys(_partition_of(h, keying), h) if keying.num_shards
                else hash_keys(h))
    assert data.column("__key").combine_chunks().cast(pa.binary()).to_pylist() == \
        want.cast(pa.binary()).to_pylist()
    assert data.num_rows == plain.num_rows


@pytest.mark.parametrize("keying", KEYINGS, ids=["two", "one", "reversed-sampled"])
def test_row_hashes_made_on_the_main_thread_cut_the_same_slab(keying: Keying) -> None:
    """A range task hashes a flush's rows on its main thread (slabs.with_row_hashes) and
    the cut takes them: the same slab bytes and sample as the cut hashing them itself,
    rows in the rollup's order or not; hashed keys get no such column."""
    raw = rows(np.random.default_rng(13), SMALL + 20_000, 3)
    for table in (rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True),
                  rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True,
                               order_by=keying.columns)):
        hashed = with_row_hashes(table, keying, LAYOUT)
        assert ROW_HASH in hashed.column_names and ROW_HASH not in table.column_names
        assert _cut(hashed, keying) == _cut(table, keying)
    hashed_key = Keying("hashed", ("country",))
    assert with_row_hashes(table, hashed_key, LAYOUT) is table
