"""The late plan from slabs' statistics (shuffled.spark.phase2.shardplan), against what
Druid's docs promise (https://druid.apache.org/docs/latest/ingestion/native-batch#partitionsspec):
``targetRowsPerSegment`` gives segments of about that many rows, ``maxRowsPerSegment`` a
maximum. Slabs are cut by phase 1's own writer (shuffled.spark.phase1.slabs) from skewed
rows spread over several subtasks (a key in several of them, as real input does), their
statistics decoded from the bytes, merged per chunk; each shard's rows are then counted
exactly: the distinct rolled-up keys whose key falls in its range."""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timezone
from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.slab import sketch
from shuffled.slab.keys import KEY_COLUMN
from shuffled.spark.phase1.config import Keying
from shuffled.spark.phase1.slabs import SAMPLE, cut_slab
from shuffled.spark.phase2 import shardplan
from shuffled.spark.rows.rollup import CHUNK, TIME, Layout
from tests.helpers.slab_decode import decode

DAY = 86_400_000
LAYOUT = Layout((("country", "string"), ("device", "string"), ("user", "string")),
                (("count", "count", "sum", "long", None),))


def skewed_rows(rng: np.random.Generator, rows: int, days: int) -> pa.Table:
    """Raw rows over ``days`` day chunks: Zipf-skewed country and device, a user id that
    makes most rolled-up rows distinct, hours of the day as ``__time``."""
    day = rng.integers(0, days, rows) * DAY
    country = np.minimum(rng.zipf(1.6, rows), 40)
    device = np.minimum(rng.zipf(1.3, rows), 300)
    user = rng.integers(0, rows // 3, rows)
    return pa.table({
        CHUNK: pa.array(day, pa.int64()),
        TIME: pa.array(day + rng.integers(0, 24, rows) * 3_600_000, pa.int64()),
        "country": pa.array([f"c{c:02d}" for c in country.tolist()]),
        "device": pa.array([f"d{d:03d}" for d in device.tolist()]),
        "user": pa.array([f"u{u}" for u in user.tolist()]),
        "count": pa.array(np.ones(rows, np.int64)),
    })


def rolled(table: pa.Table) -> pa.Table:
    """A subtask's own rollup of its rows (distinct keys, counts summed)."""
    out = table.group_by([CHUNK, TIME, "country", "device", "user"]).aggregate(
        [("count", "sum")])
    return out.rename_columns([*out.column_names[:-1], "count"])


def slabs_of(raw: pa.Table, keying: Keying, subtasks: int, seed: int) -> list:
    """The raw rows spread over ``subtasks`` at random, each rolled up and cut as a slab;
    returns the decoded slabs (statistics and data), each with its key sample."""
    rng = np.random.default_rng(seed)
    of = rng.integers(0, subtasks, raw.num_rows)
    out = []
    for t in range(subtasks):
        part = rolled(raw.filter(pa.array(of == t)))
        slab, sample = cut_slab(part, LAYOUT, keying, "day", sub_task_id=f"p{t}", slab_id=0,
                                attempt=0)
        out.append((decode(slab), sample))
    return out


def plans(decoded: list, kind: str, **goal: int) -> dict[int, shardplan.ChunkPlan]:
    per: dict[int, list[shardplan.ChunkStats]] = {}
    for d, sample in decoded:
        for st in shardplan.from_stats(d.stats, "http://d", sample):
            per.setdefault(st.start, []).append(st)
    return {c: shardplan.plan_chunk(reduce(shardplan.merge, sts), kind, **goal)
            for c, sts in per.items()}


def shard_sizes(decoded: list, plan: dict[int, shardplan.ChunkPlan]) -> dict[tuple[int, int], int]:
    """Exact rolled-up rows per (chunk, shard): distinct keys over every slab, each placed
    by its key in its chunk's ranges."""
    keyed: dict[tuple[int, tuple], bytes] = {}
    for d, _ in decoded:
        starts = d.index.column("chunk_start").to_pylist()
        rows = d.index.column("rows").to_pylist()
        chunk_of = [s for s, n in zip(starts, rows) for _ in range(n)]
        cols = [d.data.column(c).to_pylist() for c in (TIME, "country", "device", "user")]
        for chunk, key, *values in zip(chunk_of, d.data.column(KEY_COLUMN).to_pylist(), *cols):
            keyed[(chunk, tuple(values))] = key
    sizes: Counter[tuple[int, int]] = Counter()
    for (chunk, _), key in keyed.items():
        bounds = plan[chunk].bounds
        at = [i for i, b in enumerate(bounds) if shardplan.in_range(key, b)]
        assert len(at) == 1, "the shards of a chunk cover its keys once"
        sizes[(chunk, at[0])] += 1
    return sizes


@pytest.mark.parametrize("seed", [1, 2])
def test_hashed_target_gives_shards_of_about_the_target(seed: int) -> None:
    raw = skewed_rows(np.random.default_rng(seed), 60_000, 3)
    decoded = slabs_of(raw, Keying("hashed", (TIME, "country", "device", "user")), 6, seed)
    target = 2_000
    plan = plans(decoded, "hashed", target=target)
    sizes = shard_sizes(decoded, plan)
    for chunk, p in plan.items():
        true = sum(n for (c, _), n in sizes.items() if c == chunk)
        assert abs(p.estimate - true) <= 0.1 * true  # the HLL of the merged slabs
        assert p.shards == math.ceil(p.estimate / target)
        assert abs(p.shards - math.ceil(true / target)) <= 1
    assert max(sizes.values()) <= 2 * target
    assert sum(sizes.values()) / len(sizes) == pytest.approx(target, rel=0.25)


@pytest.mark.parametrize("seed", [1, 2])
def test_range_target_gives_shards_of_about_the_target(seed: int) -> None:
    raw = skewed_rows(np.random.default_rng(seed), 60_000, 3)
    decoded = slabs_of(raw, Keying("range", ("country", "user")), 6, seed)
    target = 2_000
    plan = plans(decoded, "range", target=target)
    sizes = shard_sizes(decoded, plan)
    assert max(sizes.values()) <= 2 * target
    for p in plan.values():
        assert p.shards == math.ceil(p.estimate / target)  # no key repeats enough to merge cuts
        keys = [b[0] for b in p.bounds[1:]]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_range_never_splits_a_key_and_only_its_shard_may_be_over() -> None:
    """single_dim on the skewed country: Druid's range partitioning keeps a value in one
    segment, so a value with more rows than the target makes its shard big; no other
    shard goes over twice the target."""
    raw = skewed_rows(np.random.default_rng(3), 60_000, 2)
    decoded = slabs_of(raw, Keying("range", ("country",)), 4, 3)
    target = 1_500
    plan = plans(decoded, "range", target=target)
    sizes = shard_sizes(decoded, plan)
    for (chunk, shard), n in sizes.items():
        lo, hi = plan[chunk].bounds[shard]
        if n > 2 * target:  # then the shard holds one country only
            values = {k for k in _countries_in(decoded, chunk, lo, hi)}
            assert len(values) == 1, (chunk, shard, n, values)


def _countries_in(decoded: list, chunk: int, lo: bytes | None, hi: bytes | None) -> set[str]:
    out = set()
    for d, _ in decoded:
        starts = d.index.column("chunk_start").to_pylist()
        rows = d.index.column("rows").to_pylist()
        chunk_of = [s for s, n in zip(starts, rows) for _ in range(n)]
        for c, key, country in zip(chunk_of, d.data.column(KEY_COLUMN).to_pylist(),
                                   d.data.column("country").to_pylist()):
            if c == chunk and shardplan.in_range(key, (lo, hi)):
                out.add(country)
    return out


@pytest.mark.parametrize("kind,keying", [
    ("hashed", Keying("hashed", ("country", "device", "user"))),
    ("range", Keying("range", ("device", "user"))),
], ids=["hashed", "range"])
def test_max_rows_is_a_cap(kind: str, keying: Keying) -> None:
    raw = skewed_rows(np.random.default_rng(5), 60_000, 3)
    decoded = slabs_of(raw, keying, 6, 5)
    cap = 2_500
    plan = plans(decoded, kind, cap=cap)
    sizes = shard_sizes(decoded, plan)
    assert max(sizes.values()) <= cap
    # A cap, not a much smaller target: the margin is the estimates' error (hashed: the
    # HLL and the hash's spread; range: also the sample's quantiles, a wider one).
    slack = 1.4 if kind == "hashed" else 2.0
    for p in plan.values():
        assert p.shards <= math.ceil(slack * p.estimate / cap) + 1


def test_hash_ranges_cover_the_space_in_equal_parts() -> None:
    for k in (1, 2, 3, 7, 1000):
        bounds = shardplan.hash_bounds(k)
        assert len(bounds) == k and bounds[0][0] is None and bounds[-1][1] is None
        edges = [shardplan.hash_of_bound(b[0]) for b in bounds[1:]]
        assert edges == sorted(edges)
        widths = np.diff([0, *edges, 1 << 32])
        assert widths.max() - widths.min() <= 1


def test_a_chunk_s_statistics_stay_bounded_however_many_slabs() -> None:
    """300 slabs of one chunk merge into 2 KiB of registers and at most PLAN_SAMPLE keys,
    and a chunk's plan holds its shards' bounds only."""
    assert SAMPLE == shardplan.PLAN_SAMPLE  # the merged sample is exact below it
    rng = np.random.default_rng(9)
    merged = None
    for t in range(300):
        part = rolled(skewed_rows(rng, 400, 1))
        slab, sample = cut_slab(part, LAYOUT, Keying("range", ("user",)), "day",
                                sub_task_id=f"p{t}", slab_id=t, attempt=0)
        (st,) = shardplan.from_stats(decode(slab).stats, f"http://d{t % 3}", sample)
        merged = st if merged is None else shardplan.merge(merged, st)
        assert len(merged.keys) <= shardplan.PLAN_SAMPLE
        assert merged.regs.nbytes == 2048
    assert merged is not None
    assert merged.servers == {"http://d0", "http://d1", "http://d2"}
    plan = shardplan.plan_chunk(merged, "range", target=5_000)
    assert plan.shards == len(plan.bounds) == math.ceil(plan.estimate / 5_000)


MONTHS = np.array([int(datetime(y, m, 1, tzinfo=timezone.utc).timestamp() * 1000)
                   for y in (1969, 1970, 2024) for m in range(1, 13)], np.int64)


@pytest.mark.parametrize("seed", range(4))
def test_chunk_order_is_the_lexsort_it_replaces(seed: int) -> None:
    """A slab's rows in (chunk, key) order: one uint64 per row sorted where the chunk's
    number and the key fit in it, else numpy's lexsort; the same permutation either way
    (both stable), chunks in order or not, keys of every width."""
    from shuffled.spark.phase1.slabs import chunk_order

    rng = np.random.default_rng(seed)
    for trial in range(50):
        n = int(rng.integers(0, 3000))
        kind = trial % 5
        if kind == 3:  # month starts (their gcd a day), some before 1970
            chunks = MONTHS[rng.integers(0, len(MONTHS), n)]
        elif kind == 4:  # starts more than 2^32 steps apart: ranked instead
            chunks = rng.choice([-(2 ** 62), -1, 0, 7, 2 ** 61 + 3], n)
        else:
            chunks = rng.integers(0, int(rng.integers(1, 60)), n) * 3_600_000
        if trial % 2:
            chunks = np.sort(chunks)
        count = int(rng.choice([1, 2, 7, 1000, 2 ** 31, 2 ** 40]))
        major = rng.integers(0, count, n)
        minor = rng.integers(0, 4 if trial % 3 else 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
        assert chunk_order(chunks, major, count, minor).tolist() == \
            np.lexsort((minor, major, chunks)).tolist()
        assert chunk_order(chunks, major, count).tolist() == np.lexsort((major, chunks)).tolist()


def test_small_batches_go_uncompressed_whatever_the_setting() -> None:
    """partialCompression's rule (docs/ingestion.md): batches averaging under 64 KiB are not
    compressed, LZ4 costing ten times their encoding. A slab's batches are a chunk's rows
    at most: 60,000 rows over 400 days are batches of ~150 rows, sent as they are; the
    same rows in one day (4,096-row batches, ~100 KiB) are compressed."""
    rng = np.random.default_rng(5)
    keying = Keying("hashed", (TIME, "country", "device", "user"))

    def data_bytes(table: pa.Table, compression: str) -> bytes:
        slab, _ = cut_slab(rolled(table), LAYOUT, keying, "day", sub_task_id="p0", slab_id=0,
                           attempt=0, compression=compression)
        return slab.data.to_pybytes()

    days = skewed_rows(rng, 60_000, 400)
    assert data_bytes(days, "lz4") == data_bytes(days, "none")
    one_day = skewed_rows(rng, 60_000, 1)
    assert len(data_bytes(one_day, "lz4")) < len(data_bytes(one_day, "none"))



def test_numshards_slabs_ship_no_sketch() -> None:
    """With numShards the plan is known before phase 1 reads a row (Druid's hashed
    partitionsSpec: numShards "skips the determine-partitions phase"): the slabs ship no
    HLL (every chunk's registers empty), and a chunk's figure is the rows shipped, exact,
    which is what phase 2 reads and balances its tasks by."""
    raw = skewed_rows(np.random.default_rng(11), 90_000, 2)
    keying = Keying("hashed", (TIME, "country", "device", "user"), 4)
    decoded = slabs_of(raw, keying, 3, seed=11)
    shipped: Counter[int] = Counter()
    for d, _ in decoded:
        table = d.stats
        assert table.column("hll").to_pylist() == [b""] * table.num_rows
        for start, rows in zip(table.column("chunk_start").to_pylist(),
                               table.column("rows").to_pylist(), strict=True):
            shipped[start] += rows
    got = plans(decoded, "hashed", shards=4)
    assert set(got) == set(shipped)
    for chunk, plan in got.items():
        assert plan.shards == 4
        assert plan.estimate == plan.rows == shipped[chunk]


def test_a_chunk_sketched_by_some_slabs_only_is_not_estimated() -> None:
    """Were one chunk's slabs sketched and not (two specs in one job cannot, but a rerun
    under another version could), the merged registers would count only some of its rows:
    the merge keeps no sketch, and the estimate is the rows shipped."""
    raw = skewed_rows(np.random.default_rng(5), 20_000, 1)
    sketched = slabs_of(raw, Keying("hashed", (TIME, "country", "device", "user")), 1, 5)
    bare = slabs_of(raw, Keying("hashed", (TIME, "country", "device", "user"), 2), 1, 5)
    (a,) = shardplan.from_stats(sketched[0][0].stats, "http://d")
    (b,) = shardplan.from_stats(bare[0][0].stats, "http://e")
    assert len(a.regs) and not len(b.regs)
    assert a.estimate < a.rows  # the rows repeat keys: the sketch counts them once
    for merged in (shardplan.merge(a, b), shardplan.merge(b, a)):
        assert not len(merged.regs)
        assert merged.estimate == merged.rows == a.rows + b.rows


@pytest.mark.parametrize("keying", [
    Keying("hashed", (TIME, "country", "device", "user")),
    Keying("hashed", (TIME, "country", "device", "user"), 3),
    Keying("range", ("country", "device")),
], ids=["hashed", "numShards", "range"])
def test_dictionary_strings_cut_the_same_slab(keying: Keying) -> None:
    """A flush's string dimensions arrive dictionary-encoded or plain (phase 1 keeps the
    input's dictionaries until the slab is cut): the slab is the same bytes either way,
    statistics included, so that the HLLs of one chunk's slabs merge as one."""
    table = rolled(skewed_rows(np.random.default_rng(3), 20_000, 2))
    encoded = table
    for name in ("country", "device", "user"):
        at = encoded.schema.get_field_index(name)
        encoded = encoded.set_column(at, name, encoded.column(name).dictionary_encode())

    def cut(t: pa.Table) -> tuple[bytes, bytes]:
        slab, _ = cut_slab(t, LAYOUT, keying, "day", sub_task_id="p0", slab_id=0, attempt=0)
        return slab.data.to_pybytes(), slab.stats

    assert cut(encoded) == cut(table)


@pytest.mark.parametrize("seed", [1, 2])
def test_range_target_from_a_sample_at_a_rate(seed: int) -> None:
    """targetRowsPerSegment on range keys samples each chunk's distinct rolled-up rows at
    KEYS_PER_SHARD / target (the rows whose hash is below that share: every slab draws
    alike), so a chunk's sample is about KEYS_PER_SHARD keys a shard, not every key, and
    the shards still keep Druid's promise of about the target (none over twice it)."""
    raw = skewed_rows(np.random.default_rng(seed), 60_000, 3)
    target = 2_000
    rate = shardplan.KEYS_PER_SHARD / target
    decoded = slabs_of(raw, Keying("range", ("country", "user"), sample_rate=rate), 6, seed)
    merged = {}
    for d, sample in decoded:
        assert sample.rate == rate
        assert (sample.hashes < sketch.rate_threshold(rate)).all()
        for st in shardplan.from_stats(d.stats, "http://d", sample):
            merged[st.start] = st if st.start not in merged else shardplan.merge(
                merged[st.start], st)
    plan = plans(decoded, "range", target=target)
    sizes = shard_sizes(decoded, plan)
    assert max(sizes.values()) <= 2 * target
    for chunk, st in merged.items():
        true = sum(n for (c, _), n in sizes.items() if c == chunk)
        assert not st.exact_sample  # counted by the HLL, not by the sample
        assert 0.5 * rate * true <= len(st.keys) <= 1.5 * rate * true
        assert plan[chunk].shards == math.ceil(plan[chunk].estimate / target)


def test_samples_at_two_rates_merge_at_the_lower() -> None:
    """A slab sampled at another rate (a recompute under another setting, say) merges into
    a sample at the lower rate only: its extra keys would over-weigh its rows."""
    raw = rolled(skewed_rows(np.random.default_rng(4), 20_000, 1))
    stats = []
    for t, rate in enumerate((1.0, 0.1)):
        slab, sample = cut_slab(raw, LAYOUT, Keying("range", ("user",), sample_rate=rate),
                                "day", sub_task_id=f"p{t}", slab_id=0, attempt=0)
        (st,) = shardplan.from_stats(decode(slab).stats, "http://d", sample)
        stats.append(st)
    merged = shardplan.merge(*stats)
    assert merged.rate == 0.1
    assert (merged.hashes < sketch.rate_threshold(0.1)).all()
    assert len(merged.keys) == len(stats[1].keys)


def _stats(rng: np.random.Generator, start: int, rate: float, count: int,
           server: str) -> shardplan.ChunkStats:
    """A chunk's statistics as one slab gives them: ``count`` distinct row hashes below
    the rate's threshold, each row's range key a function of its hash (many rows share
    a key), sorted by key; registers at random."""
    top = int(sketch.rate_threshold(rate))
    hashes = np.unique(rng.integers(0, 1 << 20, count, dtype=np.uint64) * np.uint64(
        max(1, top >> 20)))[:count]
    keys = pa.array([f"k{int(h) % 7}".encode() for h in hashes], pa.binary())
    order = np.asarray(pc.sort_indices(keys))
    return shardplan.ChunkStats(start, start + DAY, int(rng.integers(count, 3 * count + 1)),
                                rng.integers(0, 20, sketch.REGISTERS, dtype=np.uint8),
                                keys.take(pa.array(order)), hashes[order],
                                frozenset([server]), rate)


def test_merge_at_two_rates_keeps_the_lower_rate_even_from_an_empty_sample() -> None:
    """A union of samples at two rates is a sample at the lower one only
    (``ChunkStats.rate``): a slab whose sample at the lower rate drew no row still
    lowers it, and the other's rows above that rate's threshold go."""
    rng = np.random.default_rng(5)
    a = _stats(rng, 0, 1.0, 200, "d0")
    b = _stats(rng, 0, 0.25, 0, "d1")
    for m in (shardplan.merge(a, b), shardplan.merge(b, a)):
        assert m.rate == 0.25 and 0 < len(m.hashes) < len(a.hashes)
        assert (m.hashes < sketch.rate_threshold(0.25)).all()
        assert m.keys.equals(pc.take(m.keys, pc.sort_indices(m.keys)))


def test_a_range_slab_ships_no_key_sample_in_its_statistics() -> None:
    """docs/slab.md, the statistics section: its per-chunk ``sample`` is written empty
    (the plan's sample of distinct rows travels with the task's report, and nothing read
    this one); its keys were ~30% of comparison 12's range bytes shuffled. The section
    is then bounded by the chunks' registers, whatever the keys."""
    rng = np.random.default_rng(21)
    part = rolled(skewed_rows(rng, 20_000, 30))
    slab, sample = cut_slab(part, LAYOUT, Keying("range", ("country", "user")), "day",
                            sub_task_id="p0", slab_id=0, attempt=0)
    stats = decode(slab).stats
    assert stats.num_rows == 30
    assert stats.column("sample").to_pylist() == [[]] * 30
    assert sample is not None and len(sample.keys) > 10_000  # the report's sample
    assert len(slab.stats) < 30 * (sketch.REGISTERS + 64)


@pytest.mark.parametrize("keying", [
    Keying("hashed", (TIME, "country", "device", "user")),
    Keying("range", ("country", "device")),
    Keying("hashed", (TIME, "country", "device", "user"), 2),  # numShards: not sketched
], ids=["hashed", "range", "numShards"])
def test_the_writers_registers_are_the_statistics_it_sends(keying: Keying) -> None:
    """A slab hands its writer the HLL registers it encoded (build.Slab.registers), and
    from_stats given them yields the chunks it yields from the section's bytes alone."""
    raw = skewed_rows(np.random.default_rng(8), 30_000, 40)
    part = rolled(raw)
    slab, sample = cut_slab(part, LAYOUT, keying, "day", sub_task_id="p0", slab_id=0,
                            attempt=0)
    table = decode(slab).stats
    if keying.num_shards:
        assert slab.registers is None
    else:
        assert slab.registers is not None and slab.registers.shape == (table.num_rows,
                                                                       sketch.REGISTERS)
    given = list(shardplan.from_stats(table, "http://d", sample, slab.registers))
    read = list(shardplan.from_stats(table, "http://d", sample))
    assert len(given) == len(read) == table.num_rows > 1
    for a, b in zip(given, read, strict=True):
        assert (a.start, a.end, a.rows, a.servers, a.rate) == (b.start, b.end, b.rows,
                                                               b.servers, b.rate)
        assert np.array_equal(a.regs, b.regs) and a.keys.equals(b.keys)
        assert a.estimate == b.estimate
