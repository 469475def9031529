"""A reducer's chunks planned at once (``shardplan.plan_chunks``) give the plans that
merging each chunk's statistics in order and planning it alone gives (``merge`` and
``plan_chunk``, whose sizes tests/spark/slab/test_shardplan.py checks against Druid's
documented partitionsSpec): the same shards, bounds, estimates, rows and daemons, for
samples from real slabs, samples at a rate, at two rates, empty ones and many shards."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.slab import sketch
from shuffled.spark.phase1.config import Keying
from shuffled.spark.phase2 import shardplan
from tests.spark.slab.test_shardplan import DAY, TIME, skewed_rows, slabs_of


def one_at_a_time(groups, kind: str, **goal) -> list[shardplan.ChunkPlan]:
    return [shardplan.plan_chunk(reduce(shardplan.merge, g), kind, **goal) for g in groups]


def groups_of(decoded: list) -> list[list[shardplan.ChunkStats]]:
    per: dict[int, list[shardplan.ChunkStats]] = {}
    for n, (d, sample) in enumerate(decoded):
        for st in shardplan.from_stats(d.stats, f"http://d{n % 3}", sample):
            per.setdefault(st.start, []).append(st)
    return list(per.values())


@pytest.mark.parametrize("rate", [1.0, 0.05])
@pytest.mark.parametrize("target", [40, 700, 5_000])
def test_real_slabs_plan_alike(rate: float, target: int) -> None:
    raw = skewed_rows(np.random.default_rng(int(target * rate) + 1), 30_000, 4)
    keying = Keying("range", ("country", "user"), sample_rate=rate)
    groups = groups_of(slabs_of(raw, keying, 5, 3))
    got = shardplan.plan_chunks(groups, "range", target=target)
    assert got == one_at_a_time(groups, "range", target=target)
    assert sum(p.shards for p in got) > len(got) or target == 5_000


def _stats(rng: np.random.Generator, start: int, rate: float, hashes: np.ndarray,
           server: str, distinct_keys: int) -> shardplan.ChunkStats:
    """A chunk's statistics as a slab ships them: rows of distinct hashes below the rate's
    threshold, each row's range key a function of its hash (many rows share a key),
    sorted by key."""
    hashes = hashes[hashes < sketch.rate_threshold(rate)] if rate < 1 else hashes
    keys = pa.array([f"k{int(h) % distinct_keys:05d}".encode() for h in hashes], pa.binary())
    order = np.asarray(pc.sort_indices(keys), np.int64)
    return shardplan.ChunkStats(start, start + DAY, int(rng.integers(len(hashes), 3 * len(hashes) + 2)),
                                rng.integers(0, 24, sketch.REGISTERS, dtype=np.uint8),
                                keys.take(pa.array(order)), hashes[order],
                                frozenset([server]), rate)


@pytest.mark.parametrize("seed", range(8))
def test_synthetic_statistics_plan_alike(seed: int) -> None:
    """Chunks of one to five tasks' statistics; the same row in several of them (one
    hash, one key: a key two subtasks shipped), rates that differ within a chunk, empty
    samples, samples over PLAN_SAMPLE once merged, and chunks that shipped no rows."""
    rng = np.random.default_rng(seed)
    groups = []
    for chunk in range(60):
        start = chunk * DAY
        pool = np.unique(rng.integers(0, 2**64 - 1, int(rng.choice([40, 3_000, 9_000])) + 1,
                                      dtype=np.uint64))
        distinct = int(rng.choice([1, 3, 50, 2_000]))
        tasks = int(rng.integers(1, 6))
        rates = [float(rng.choice([1.0, 0.5, 0.1]))] * tasks
        if rng.random() < 0.3:
            rates[int(rng.integers(0, tasks))] = 0.25
        group = []
        for t in range(tasks):
            mine = pool[rng.random(len(pool)) < rng.choice([0.0, 0.3, 0.9])]
            group.append(_stats(rng, start, rates[t], mine, f"http://d{t % 2}", distinct))
        if rng.random() < 0.1:
            group = [shardplan.ChunkStats(start, start + DAY, 0,
                                          np.zeros(sketch.REGISTERS, np.uint8),
                                          pa.array([], pa.binary()), np.zeros(0, np.uint64),
                                          frozenset(["http://d0"]), rates[0])]
        groups.append(group)
    # A reducer merges a chunk's first statistics into one past FOLD_AT: the same plans.
    folded = [[reduce(shardplan.merge, g[:3]), *g[3:]] for g in groups]
    for target in (1, 7, 100, 10_000):
        want = one_at_a_time(groups, "range", target=target)
        assert shardplan.plan_chunks(groups, "range", target=target) == want
        assert shardplan.plan_chunks(folded, "range", target=target) == want


def test_other_specs_plan_a_chunk_at_a_time_alike() -> None:
    raw = skewed_rows(np.random.default_rng(9), 20_000, 3)
    groups = groups_of(slabs_of(raw, Keying("range", ("country", "user")), 4, 1))
    for kind, goal in (("range", {"cap": 900}), ("hashed", {"target": 900}),
                       ("hashed", {"shards": 3})):
        assert shardplan.plan_chunks(groups, kind, **goal) == one_at_a_time(groups, kind, **goal)
    assert shardplan.plan_chunks([], "range", target=10) == []


@pytest.mark.parametrize("goal", [{"target": 40}, {"target": 700}, {"target": 5_000},
                                  {"cap": 300}], ids=["t40", "t700", "t5000", "cap300"])
def test_hashed_plans_alike(goal: dict[str, int]) -> None:
    """Hashed keys without numShards are planned at once too (their estimates in one
    pass): the same plans as one chunk at a time, with a chunk some of whose slabs ship
    no sketch (its estimate is then its rows) and one of no rows."""
    raw = skewed_rows(np.random.default_rng(17), 30_000, 4)
    groups = groups_of(slabs_of(raw, Keying("hashed", (TIME, "country", "device", "user")),
                                5, 3))
    bare = groups[0][0]
    groups.append([bare, shardplan.ChunkStats(bare.start, bare.end, 12, np.zeros(0, np.uint8),
                                              bare.keys, bare.hashes, frozenset(["http://x"]))])
    groups.append([shardplan.ChunkStats(bare.start + DAY, bare.end + DAY, 0,
                                        np.zeros(sketch.REGISTERS, np.uint8), bare.keys,
                                        bare.hashes, frozenset(["http://y"]))])
    got = shardplan.plan_chunks(groups, "hashed", **goal)
    assert got == one_at_a_time(groups, "hashed", **goal)
    assert got[-2].estimate == got[-2].rows and got[-1].estimate == 0
    assert sum(p.shards for p in got) > len(got) or goal == {"target": 5_000}


def test_a_hash_in_two_chunks_is_a_row_of_each() -> None:
    """Copies of a row are found by its hash; a hash two chunks hold (a 64-bit collision
    between rows of different chunks) is counted in each, as merging one chunk at a time
    counts it."""
    rng = np.random.default_rng(2)
    shared = np.unique(rng.integers(0, 2**63, 300, dtype=np.int64).astype(np.uint64))
    groups = [[_stats(rng, c * DAY, 1.0, shared, "http://d0", 40),
               _stats(rng, c * DAY, 1.0, shared[::2], "http://d1", 40)] for c in range(3)]
    for target in (20, 150):
        want = one_at_a_time(groups, "range", target=target)
        assert shardplan.plan_chunks(groups, "range", target=target) == want
        assert [p.estimate for p in want] == [len(shared)] * 3
