"""A task's chunk statistics cross the late plan's shuffle as one block per reducer
(shuffled.spark.phase2.statblock): pickled and read back, each chunk's statistics are the
ones that went in (rows, registers or none, the sample's keys and hashes in order, the
rate, the daemons), every chunk reaches the reducer late.reducer_of gives it, and a
reducer's plans are those of the statistics sent one at a time."""

from __future__ import annotations

import pickle
from functools import reduce

import numpy as np
import pyarrow as pa
import pytest

from shuffled.slab import sketch
from shuffled.spark.driver import late
from shuffled.spark.phase1.config import Keying
from shuffled.spark.phase2 import shardplan
from shuffled.spark.phase2.statblock import StatsBlock, by_reducer
from tests.spark.slab.test_plan_chunks import groups_of
from tests.spark.slab.test_shardplan import DAY, TIME, skewed_rows, slabs_of

T0 = 1_262_304_000_000


def _same(a: shardplan.ChunkStats, b: shardplan.ChunkStats) -> None:
    assert (a.start, a.end, a.rows, a.rate, a.servers) == (b.start, b.end, b.rows, b.rate,
                                                           b.servers)
    assert np.array_equal(a.regs, b.regs) and a.regs.dtype == b.regs.dtype
    assert a.keys.equals(b.keys) and a.keys.type == pa.binary()
    assert np.array_equal(a.hashes, b.hashes) and a.hashes.dtype == np.uint64


def _varied() -> list[shardplan.ChunkStats]:
    rng = np.random.default_rng(4)
    out = []
    for i in range(40):
        n = int(rng.choice([0, 1, 30, 500]))
        keys = pa.array(sorted(f"k{int(x)}".encode() for x in rng.integers(0, 99, n)),
                        pa.binary())
        regs = (np.zeros(0, np.uint8) if i % 5 == 0 else
                rng.integers(0, 30, sketch.REGISTERS, dtype=np.uint8))
        servers = frozenset([f"http://d{i % 3}"] + ([f"http://r{i % 2}"] if i % 7 == 0 else []))
        out.append(shardplan.ChunkStats(T0 + i * DAY, T0 + (i + 1) * DAY,
                                        int(rng.integers(0, 10_000)), regs, keys.slice(0),
                                        rng.integers(0, 2**63, n).astype(np.uint64), servers,
                                        float(rng.choice([1.0, 0.25]))))
    return out


@pytest.mark.parametrize("which", ["varied", "none sketched", "empty"])
def test_a_block_gives_back_the_statistics_it_was_made_of(which: str) -> None:
    stats = _varied()
    if which == "none sketched":
        stats = [shardplan.ChunkStats(s.start, s.end, s.rows, np.zeros(0, np.uint8), s.keys,
                                      s.hashes, s.servers, s.rate) for s in stats]
    elif which == "empty":
        stats = []
    block = pickle.loads(pickle.dumps(StatsBlock.of(stats)))
    back = list(block.stats())
    assert len(back) == len(stats) == len(block)
    for a, b in zip(stats, back, strict=True):
        _same(a, b)


def test_keys_sliced_from_a_larger_array_go_as_their_own_bytes() -> None:
    """A sample's keys are slices of its slab's (offsets not starting at 0)."""
    whole = pa.array([b"a", b"bb", b"ccc", b"dddd"], pa.binary())
    st = shardplan.ChunkStats(T0, T0 + DAY, 9, np.ones(sketch.REGISTERS, np.uint8),
                              whole.slice(1, 2), np.array([5, 6], np.uint64),
                              frozenset(["http://d"]))
    back = list(pickle.loads(pickle.dumps(StatsBlock.of([st]))).stats())
    _same(st, back[0])


@pytest.mark.parametrize("reducers", [1, 2, 3, 8])
def test_each_chunk_reaches_the_reducer_late_gives_it(reducers: int) -> None:
    stats = _varied()
    got: dict[int, list[int]] = {}
    for r, block in by_reducer(stats, reducers, lambda s: late.reducer_of(("c", s))):
        assert late.partition_of(("b", r)) % reducers == r
        got[r] = [st.start for st in block.stats()]
    for st in stats:
        assert st.start in got[late.reducer_of(("c", st.start)) % reducers]
    assert sorted(s for v in got.values() for s in v) == sorted(st.start for st in stats)


@pytest.mark.parametrize("kind", ["range", "hashed"])
def test_a_reducer_plans_blocks_as_the_statistics_they_hold(kind: str) -> None:
    """Real slabs of three tasks, each task's statistics sent as blocks: the plans are
    those of the statistics merged one chunk at a time."""
    raw = skewed_rows(np.random.default_rng(21), 20_000, 4)
    keying = (Keying("range", ("country", "user"), sample_rate=0.5) if kind == "range"
              else Keying("hashed", (TIME, "country", "device", "user")))
    groups = groups_of(slabs_of(raw, keying, 3, 2))
    tasks = [[g[t] for g in groups if len(g) > t] for t in range(max(map(len, groups)))]
    held: dict[int, list[shardplan.ChunkStats]] = {}
    for mine in tasks:
        for _, block in by_reducer(mine, 1, lambda s: 0):
            for st in pickle.loads(pickle.dumps(block)).stats():
                held.setdefault(st.start, []).append(st)
    want = [shardplan.plan_chunk(reduce(shardplan.merge, g), kind, target=700) for g in groups]
    got = shardplan.plan_chunks(list(held.values()), kind, target=700)
    assert sorted(got, key=lambda p: p.start) == sorted(want, key=lambda p: p.start)
