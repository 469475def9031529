"""The late plan (docs/slab.md, issue 36): each time chunk's shards, chosen after phase 1
from its slabs' statistics instead of by a first pass over the input.

Druid's ``partitionsSpec`` (https://druid.apache.org/docs/latest/ingestion/native-batch#partitionsspec):
``targetRowsPerSegment`` asks for segments of about that many rows, ``maxRowsPerSegment``
for a maximum. Here, per chunk:

- the rolled-up rows are estimated from the merged HyperLogLog of its slabs (capped by the
  rows phase 1 shipped, an upper bound: rollup only removes rows);
- the shard count is ``ceil(estimate / targetRowsPerSegment)``; for ``maxRowsPerSegment``
  (a hard cap) the smallest count whose shards stay under the cap at three standard errors
  of every estimate involved (:func:`shard_count`);
- the bounds are equal ranges of the 32-bit hash space (hashed) or weighted quantiles of
  the merged sample of range keys (range, single_dim), each shard a half-open key range
  ``[key_from, key_to)`` of :mod:`shuffled.slab.keys` bytes (None: unbounded).

What a chunk holds here is bounded whatever the input (:class:`ChunkStats`: 2 KiB of
registers, at most :data:`PLAN_SAMPLE` weighted keys, the daemons), so the statistics are
merged per chunk on the executors (``reduceByKey``) and only the plan, bounded by the
shards, reaches the driver. Pure functions over numpy and pyarrow.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.slab import keys as slab_keys
from shuffled.slab import sketch

HASH_SPACE = 1 << 32
#: Weighted range keys a chunk's merged statistics keep: a shard's share of its chunk is
#: then known to about sqrt(shards / PLAN_SAMPLE) of itself (a slab brings at most 256).
PLAN_SAMPLE = 4096
#: The HLL's relative standard error (2^11 registers): 1.04 / sqrt(m), about 2.3%.
HLL_RSE = 1.04 / math.sqrt(sketch.REGISTERS)
#: Standard errors of margin for maxRowsPerSegment's cap.
SIGMAS = 3.0

Bound = tuple[bytes | None, bytes | None]  # [key_from, key_to): None is unbounded


@dataclass(frozen=True)
class ChunkStats:
    """One time chunk's statistics merged over slabs: rows shipped, HLL registers of the
    rolled-up keys, a weighted sample of range keys (sorted; each key stands for
    ``weights[i]`` rows) and the daemons holding its slabs."""

    start: int
    end: int
    rows: int
    regs: np.ndarray
    keys: pa.Array
    weights: np.ndarray
    servers: frozenset[str]

    @property
    def estimate(self) -> int:
        """The chunk's rolled-up rows, estimated (never over the rows shipped)."""
        if self.rows == 0:
            return 0
        return max(1, min(self.rows, round(sketch.estimate(self.regs))))

    @property
    def exact_sample(self) -> bool:
        """The sample holds every row shipped (each of weight 1): no sampling error."""
        return len(self.keys) == self.rows and bool(np.all(self.weights == 1.0))


def from_stats(table: pa.Table, server: str) -> Iterator[ChunkStats]:
    """A slab's statistics section (:data:`shuffled.slab.sketch.STATS_SCHEMA`), one
    :class:`ChunkStats` per chunk, its slab held on ``server``."""
    starts = table.column("chunk_start").to_pylist()
    ends = table.column("chunk_end").to_pylist()
    rows = table.column("rows").to_pylist()
    hll = table.column("hll").combine_chunks()
    samples = table.column("sample").combine_chunks()
    for i, (start, end, n) in enumerate(zip(starts, ends, rows, strict=True)):
        regs = np.frombuffer(hll[i].as_buffer(), dtype=np.uint8).copy()
        picked = samples[i].values if samples[i].is_valid else pa.array([], pa.binary())
        picked = picked.cast(pa.binary())
        weights = np.full(len(picked), n / len(picked) if len(picked) else 0.0)
        yield _sorted(ChunkStats(int(start), int(end), int(n), regs, picked, weights,
                                 frozenset([server])))


def _sorted(st: ChunkStats) -> ChunkStats:
    if len(st.keys) < 2:
        return st
    order = pc.sort_indices(st.keys)
    return ChunkStats(st.start, st.end, st.rows, st.regs, st.keys.take(order),
                      st.weights[order.to_numpy()], st.servers)


def compact(keys: pa.Array, weights: np.ndarray, size: int = PLAN_SAMPLE,
            ) -> tuple[pa.Array, np.ndarray]:
    """At most ``size`` of ``keys`` (sorted) keeping their weighted quantiles: the keys at
    ``size`` equally spaced points of the cumulative weight, each then standing for an
    equal share (systematic sampling; each compaction moves a quantile by at most one
    share). Deterministic, so a chunk's plan does not depend on the merge order's luck."""
    if len(keys) <= size:
        return keys, weights
    total = float(weights.sum())
    cum = np.cumsum(weights)
    points = (np.arange(size) + 0.5) * (total / size)
    at = np.minimum(np.searchsorted(cum, points, side="left"), len(keys) - 1)
    return keys.take(pa.array(at)), np.full(size, total / size)


def merge(a: ChunkStats, b: ChunkStats, size: int = PLAN_SAMPLE) -> ChunkStats:
    """Two statistics of one chunk as one (registers by maximum, samples weighted)."""
    keys = pa.concat_arrays([a.keys, b.keys])
    weights = np.concatenate([a.weights, b.weights])
    if len(keys) > 1:
        order = pc.sort_indices(keys)
        keys, weights = keys.take(order), weights[order.to_numpy()]
    keys, weights = compact(keys, weights, size)
    return ChunkStats(a.start, max(a.end, b.end), a.rows + b.rows, np.maximum(a.regs, b.regs),
                      keys, weights, a.servers | b.servers)


def shard_count(estimate: int, *, target: int | None = None, cap: int | None = None,
                sample: int | None = None) -> int:
    """Shards for a chunk of ``estimate`` rolled-up rows.

    ``target`` (targetRowsPerSegment): ``ceil(estimate / target)``, shards of about the
    target. ``cap`` (maxRowsPerSegment, a hard cap): the smallest count whose shards stay
    under the cap with the estimate at its upper three-sigma bound (HLL: 2.3% standard
    error) and, per shard, three sigmas of its own spread: hashed (``sample`` None) a
    hash range's rows are binomial (sd ``sqrt(rows)``); range, a shard between two
    quantiles of a sample of ``sample`` keys holds its share to about ``sqrt(shards /
    sample)`` of itself."""
    if estimate <= 0:
        return 1
    if cap is None:
        return max(1, math.ceil(estimate / max(target or 1, 1)))
    high = estimate * (1 + SIGMAS * HLL_RSE)

    def fits(k: int) -> bool:
        per = high / k
        spread = (SIGMAS * math.sqrt(per) if sample is None
                  else SIGMAS * per * math.sqrt(k / max(sample, 1)))
        return per + spread <= cap

    k = max(1, math.ceil(high / cap))
    limit = max(k, sample or k) if sample is not None else max(k, 1) * 4 + 16
    while k < limit and not fits(k):
        k += 1
    return k


def hash_bounds(shards: int) -> list[Bound]:
    """``shards`` equal ranges of the 32-bit hash space, as 4-byte big-endian keys."""
    cuts = [(i * HASH_SPACE) // shards for i in range(1, shards)]
    edges: list[bytes | None] = [None, *(c.to_bytes(4, "big") for c in cuts), None]
    return list(zip(edges[:-1], edges[1:], strict=True))


def range_bounds(keys: pa.Array, weights: np.ndarray, shards: int) -> list[Bound]:
    """Up to ``shards`` key ranges cut at the weighted quantiles of ``keys`` (sorted): the
    key at cumulative weight ``i / shards`` starts shard ``i``; a cut that repeats the one
    before it, or the chunk's smallest key, is dropped (a key is never split)."""
    if shards <= 1 or len(keys) == 0:
        return [(None, None)]
    cum = np.cumsum(weights)
    total = float(cum[-1])
    values = keys.to_pylist()
    cuts: list[bytes] = []
    for i in range(1, shards):
        at = int(np.searchsorted(cum, total * i / shards, side="right"))
        if at >= len(values):
            break
        key = values[at]
        if key > values[0] and (not cuts or key > cuts[-1]):
            cuts.append(key)
    edges: list[bytes | None] = [None, *cuts, None]
    return list(zip(edges[:-1], edges[1:], strict=True))


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk's shards: their key ranges, in order (the shard number is the position),
    with the figures they were chosen from and the daemons holding the chunk's slabs."""

    start: int
    end: int
    rows: int  # shipped by phase 1 (exact): what phase 2 must read in all
    estimate: int  # rolled-up rows, estimated
    bounds: tuple[Bound, ...]
    servers: tuple[str, ...]

    @property
    def shards(self) -> int:
        return len(self.bounds)


def plan_chunk(st: ChunkStats, kind: str, *, target: int | None = None,
               cap: int | None = None) -> ChunkPlan:
    """The shards of one chunk: ``kind`` ``hashed`` or ``range`` (``single_dim`` too)."""
    est = st.estimate
    if kind == "hashed":
        bounds = hash_bounds(shard_count(est, target=target, cap=cap))
    else:
        sample = None if st.exact_sample else len(st.keys)
        k = shard_count(est, target=target, cap=cap, sample=sample if cap else None)
        if cap is not None and sample is None:
            # Every row shipped is in the sample: cut by those rows (at least the
            # rolled-up ones), no estimate's error to allow for.
            k = shard_count(st.rows, target=cap)
        bounds = range_bounds(st.keys, st.weights, k)
    return ChunkPlan(st.start, st.end, st.rows, est, tuple(bounds), tuple(sorted(st.servers)))


def in_range(key: bytes, bound: Bound) -> bool:
    """Whether ``key`` falls in ``[key_from, key_to)``."""
    lo, hi = bound
    return (lo is None or key >= lo) and (hi is None or key < hi)


def hash_of_bound(edge: bytes | None) -> int | None:
    """A hash range's edge as the uint32 it stands for (None: unbounded)."""
    return None if edge is None else slab_keys.hash_of(edge)


def tuple_of_bound(edge: bytes | None) -> list[str | None] | None:
    """A range's edge as the tuple of dimension values it stands for (None: unbounded)."""
    return None if edge is None else slab_keys.decode_tuple(edge)


def total_shards(plans: Sequence[ChunkPlan]) -> int:
    return sum(p.shards for p in plans)
