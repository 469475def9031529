"""The late plan (docs/slab.md, issue 36): each time chunk's shards, chosen after phase 1
from its slabs' statistics instead of by a first pass over the input.

Druid's ``partitionsSpec`` (https://druid.apache.org/docs/latest/ingestion/native-batch#partitionsspec):
``targetRowsPerSegment`` asks for segments of about that many rows, ``maxRowsPerSegment``
for a maximum. Here, per chunk:

- the rolled-up rows are counted from the sample when it holds them all, else estimated
  from the merged HyperLogLog of its slabs (capped by the rows phase 1 shipped, an upper
  bound: rollup only removes rows);
- the shard count is ``ceil(rows / targetRowsPerSegment)``; for ``maxRowsPerSegment``
  (a hard cap) the smallest count whose shards stay under the cap at three standard errors
  of every estimate involved (:func:`shard_count`);
- the bounds are equal ranges of the 32-bit hash space (hashed) or quantiles of a
  bottom-k sample of the chunk's distinct rolled-up rows' range keys (range, single_dim;
  merged over slabs it counts a row once however many subtasks shipped it), each shard a
  half-open key range ``[key_from, key_to)`` of :mod:`shuffled.slab.keys` bytes (None:
  unbounded).

What a chunk holds here is bounded whatever the input (:class:`ChunkStats`: 2 KiB of
registers, at most :data:`PLAN_SAMPLE` keys, the daemons), so the statistics are merged
per chunk on the executors (:func:`shuffled.spark.driver.late.run_phase1`'s reduce) and
only the plan, bounded by the shards, reaches the driver. Pure functions over numpy and
pyarrow.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.slab import keys as slab_keys
from shuffled.slab import sketch

HASH_SPACE = 1 << 32
#: Distinct rolled-up rows a chunk's merged sample keeps (range; as many as the slab
#: writer's ``slabs.SAMPLE``): a shard's share of its chunk is then known to about
#: sqrt(shards / PLAN_SAMPLE) of itself.
PLAN_SAMPLE = 4096
#: targetRowsPerSegment (range): sampled keys per shard wanted. A shard's share is then
#: known to about 1/sqrt(KEYS_PER_SHARD) of itself (12.5%: twice the target is 8 sigmas
#: off), and a chunk's sample is about KEYS_PER_SHARD x its shards, not every key.
KEYS_PER_SHARD = 64
#: The HLL's relative standard error (2^11 registers): 1.04 / sqrt(m), about 2.3%.
HLL_RSE = 1.04 / math.sqrt(sketch.REGISTERS)
#: Standard errors of margin for maxRowsPerSegment's cap.
SIGMAS = 3.0

Bound = tuple[bytes | None, bytes | None]  # [key_from, key_to): None is unbounded


@dataclass(frozen=True)
class ChunkStats:
    """One time chunk's statistics merged over slabs: rows shipped, HLL registers of the
    rolled-up keys (none with ``numShards``: :data:`_NO_REGS`), a bottom-k sample of its
    distinct rolled-up rows (range: their keys, sorted by key, with their 64-bit hashes;
    :class:`shuffled.spark.phase1.slabs.KeySample`) and the daemons holding its slabs."""

    start: int
    end: int
    rows: int
    regs: np.ndarray
    keys: pa.Array
    hashes: np.ndarray
    servers: frozenset[str]
    rate: float = 1.0  # the keys are the rows hashed below this share (KeySample.rate)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Plain bytes through Spark's shuffle: pickling the numpy and pyarrow objects cost
        # ~100 us a chunk (ChunkStats of 400 keys), this ~5.
        return (_unpickle, (self.start, self.end, self.rows, self.regs.tobytes(),
                            *keys_as_bytes(self.keys), self.hashes.tobytes(),
                            tuple(self.servers), self.rate))

    @property
    def exact_sample(self) -> bool:
        """The sample holds every distinct rolled-up row (fewer than it may keep, none
        left out by its rate)."""
        return self.rate >= 1.0 and 0 < len(self.keys) < PLAN_SAMPLE

    @property
    def estimate(self) -> int:
        """The chunk's rolled-up rows: counted when the sample holds them all, else the
        HLL's estimate (never over the rows shipped)."""
        if self.rows == 0:
            return 0
        if self.exact_sample:
            return len(self.keys)
        return hll_rows(self.rows, self.regs)


def hll_rows(rows: int, regs: np.ndarray) -> int:
    """A chunk's rolled-up rows by its HLL's estimate, at least 1 and never over the
    ``rows`` shipped (rollup only removes rows); not sketched (numShards), the rows."""
    return int(_estimates(np.array([rows], np.int64), [regs])[0])


def union(regs: Sequence[np.ndarray]) -> np.ndarray:
    """Registers of one chunk merged: by maximum, or none if any is not sketched (a chunk
    is sketched by every slab or by none, one spec a job; were it not, the sketched ones
    alone would undercount it)."""
    if not all(len(r) for r in regs):
        return _NO_REGS
    return reduce(np.maximum, regs)


def keys_as_bytes(keys: pa.Array) -> tuple[bytes, bytes]:
    """A binary array (no nulls, maybe a slice) as its offsets from 0 and its bytes, to
    pickle as plain bytes (:func:`keys_from_bytes` reads them back)."""
    offsets = np.frombuffer(keys.buffers()[1], np.int32, len(keys) + 1, keys.offset * 4) \
        if len(keys) else np.zeros(1, np.int32)
    data = keys.buffers()[2] if len(keys) else None
    lo, hi = int(offsets[0]), int(offsets[-1])
    return (offsets - lo).tobytes(), data[lo:hi].to_pybytes() if data is not None else b""


def keys_from_bytes(offsets: bytes, data: bytes) -> pa.Array:
    n = len(offsets) // 4 - 1
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)]) if n else _NO_KEYS


def _unpickle(start: int, end: int, rows: int, regs: bytes, offsets: bytes, data: bytes,
              hashes: bytes, servers: tuple[str, ...], rate: float = 1.0) -> ChunkStats:
    return ChunkStats(start, end, rows, np.frombuffer(regs, np.uint8).copy(),
                      keys_from_bytes(offsets, data), np.frombuffer(hashes, np.uint64).copy(),
                      frozenset(servers), rate)


_NO_KEYS = pa.array([], pa.binary())
_NO_HASHES = np.zeros(0, np.uint64)
#: The registers of a chunk not sketched: with ``numShards`` the plan is known up front,
#: so phase 1 ships no HLL (its registers were ~7 MB of comparison 7's 7.2 MB of Spark
#: shuffle, and hashing, encoding, decoding and merging them ~0.4 CPU s a run).
_NO_REGS = np.zeros(0, np.uint8)


def from_stats(table: pa.Table, server: str, sample: Any = None,
               registers: np.ndarray | None = None) -> Iterator[ChunkStats]:
    """A slab's statistics section (:data:`shuffled.slab.sketch.STATS_SCHEMA`), one
    :class:`ChunkStats` per chunk, its slab held on ``server``; ``sample`` its
    :class:`~shuffled.spark.phase1.slabs.KeySample` (range keys), if any; ``registers``
    the section's HLL registers as its writer made them (:attr:`.build.Slab.registers`),
    which are then not decoded again."""
    starts = table.column("chunk_start").to_pylist()
    ends = table.column("chunk_end").to_pylist()
    rows = table.column("rows").to_pylist()
    if registers is not None:  # a sketched chunk of rows sets a register at least
        regs, sketched = registers, np.asarray(table.column("rows")) > 0
    else:
        regs, sketched = sketch.decode_all(table.column("hll").combine_chunks())
    cuts: dict[int, tuple[int, int]] = {}
    if sample is not None and len(sample.chunks):
        if not sample.in_key_order:
            # Sorted by (chunk, key) at once, not a sort per chunk (3,652 day chunks a slab).
            order = slab_keys.chunk_key_order(sample.chunks, sample.keys)
            sample = replace(sample, chunks=sample.chunks[order], hashes=sample.hashes[order],
                             keys=sample.keys.take(pa.array(order)))
        change = np.flatnonzero(sample.chunks[1:] != sample.chunks[:-1]) + 1
        firsts = np.concatenate([[0], change])
        lasts = np.append(change, len(sample.chunks))
        cuts = {int(sample.chunks[a]): (int(a), int(b))
                for a, b in zip(firsts, lasts, strict=True)}
    for i, (start, end, n) in enumerate(zip(starts, ends, rows, strict=True)):
        keys, hashes = _NO_KEYS, _NO_HASHES
        if int(start) in cuts:
            a, b = cuts[int(start)]
            keys, hashes = sample.keys.slice(a, b - a), sample.hashes[a:b]
        # Empty: not sketched (a sketched chunk of rows sets a register at least). The
        # rows of one array: a chunk's statistics hold their registers as a view.
        yield ChunkStats(int(start), int(end), int(n), regs[i] if sketched[i] else _NO_REGS,
                         keys, hashes, frozenset([server]),
                         sample.rate if sample is not None else 1.0)


def _by_key(st: ChunkStats) -> ChunkStats:
    if len(st.keys) < 2:
        return st
    order = pc.sort_indices(st.keys)
    return replace(st, keys=st.keys.take(order), hashes=st.hashes[order.to_numpy()])


def merge(a: ChunkStats, b: ChunkStats, size: int = PLAN_SAMPLE) -> ChunkStats:
    """Two statistics of one chunk as one: registers by maximum; of the samples, the rows
    of the ``size`` smallest distinct hashes (a row two slabs hold counts once)."""
    keys, hashes = a.keys, a.hashes
    rate = min(a.rate, b.rate)
    if len(b.keys) or a.rate != b.rate:
        keys = pa.concat_arrays([a.keys, b.keys]) if len(a.keys) else b.keys
        hashes = np.concatenate([a.hashes, b.hashes])
        uniq, first = np.unique(hashes, return_index=True)  # sorted by hash
        if a.rate != b.rate:  # the union is a sample at the lower rate only
            below = int(np.searchsorted(uniq, sketch.rate_threshold(rate)))
            uniq, first = uniq[:below], first[:below]
        keys, hashes = keys.take(pa.array(first[:size])), uniq[:size]
    return _by_key(ChunkStats(a.start, max(a.end, b.end), a.rows + b.rows,
                              union((a.regs, b.regs)), keys, hashes, a.servers | b.servers,
                              rate))


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


def _groups(keys: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The distinct keys of ``keys`` (sorted) and the rank where each starts: found by one
    comparison of neighbours, no key made a Python object (a chunk's sample holds up to
    :data:`PLAN_SAMPLE`, and the plan of a range chunk needs one or two of them)."""
    n = len(keys)
    if n < 2:
        return keys, np.zeros(n, dtype=np.int64)
    change = np.asarray(pc.not_equal(keys.slice(1), keys.slice(0, n - 1)), dtype=bool)
    starts = np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)
    return keys.take(pa.array(starts)), starts


def _edges(cuts: list[bytes]) -> list[Bound]:
    edges: list[bytes | None] = [None, *cuts, None]
    return list(zip(edges[:-1], edges[1:], strict=True))


def range_bounds(keys: pa.Array, shards: int) -> list[Bound]:
    """Up to ``shards`` key ranges cut at the quantiles of ``keys`` (sorted: a sample of
    distinct rolled-up rows): shard ``i`` starts at the key starting nearest rank
    ``i * n / shards`` (a key is never split: cuts that would repeat are dropped)."""
    if shards <= 1 or len(keys) == 0:
        return [(None, None)]
    distinct, starts = _groups(keys)
    cuts: list[bytes] = []
    last = 0  # the distinct keys ascend: a later rank is a greater key
    for i in range(1, shards):
        want = i * len(keys) / shards
        at = int(np.argmin(np.abs(starts - want)))
        if at > last:
            cuts.append(distinct[at].as_py())
            last = at
    return _edges(cuts)


def packed_bounds(keys: pa.Array, cap: int) -> list[Bound]:
    """Key ranges of at most ``cap`` of ``keys`` (sorted, every distinct rolled-up row of
    the chunk), packed in order; a key with more rows than the cap is a shard alone."""
    distinct, starts = _groups(keys)
    sizes = np.diff(np.append(starts, len(keys)))
    cuts: list[bytes] = []
    held = 0
    for key, n in zip(distinct.to_pylist(), sizes.tolist(), strict=True):
        if held and held + n > cap:
            cuts.append(key)
            held = 0
        held += n
    return _edges(cuts)


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


def partition_bounds(shards: int) -> list[Bound]:
    """Partitions ``0 .. shards - 1`` as ranges of 8-byte (partition, hash) keys
    (``numShards`` given, :mod:`..phase1.slabs`), every bound given (no key falls outside
    them): a range cut into pages (:func:`..slab.keys.split_range`) then stays in its
    partition."""
    edges: list[bytes | None] = [(i << 32).to_bytes(8, "big") for i in range(shards + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def plan_chunk(st: ChunkStats, kind: str, *, target: int | None = None,
               cap: int | None = None, shards: int | None = None) -> ChunkPlan:
    """The shards of one chunk: ``kind`` ``hashed`` or ``range`` (``single_dim`` too);
    ``shards``: hashed with ``numShards``, the partitions as they are."""
    est = st.estimate
    if shards:
        bounds = partition_bounds(shards)
    elif kind == "hashed":
        bounds = hash_bounds(shard_count(est, target=target, cap=cap))
    elif st.exact_sample:  # every distinct row is in the sample: no estimate's error
        bounds = (packed_bounds(st.keys, cap) if cap is not None
                  else range_bounds(st.keys, shard_count(est, target=target)))
    else:
        bounds = range_bounds(st.keys, shard_count(est, target=target, cap=cap,
                                                   sample=len(st.keys)))
    return ChunkPlan(st.start, st.end, st.rows, est, tuple(bounds), tuple(sorted(st.servers)))


def plan_chunks(groups: Sequence[Sequence[ChunkStats]], kind: str, *,
                target: int | None = None, cap: int | None = None,
                shards: int | None = None) -> list[ChunkPlan]:
    """:func:`plan_chunk` of each group's statistics (one chunk's, from the tasks that
    shipped rows in it) merged in order by :func:`merge`: a reducer's chunks at once.

    Range keys toward ``targetRowsPerSegment`` are merged and cut in a few array passes
    over every chunk's sample together (:func:`_range_plans`): merged and planned one chunk
    at a time, as a dozen small Arrow calls each, the reduce took 386 of comparison 12's
    range phase-1 samples against numShards' 77. The plans are the same
    (tests/spark/slab/test_plan_chunks.py). Every other spec plans a chunk at a time."""
    if kind == "hashed" and not shards:
        return _hashed_plans(groups, target=target, cap=cap)
    if kind == "hashed" or shards or cap is not None:
        return [plan_chunk(reduce(merge, g), kind, target=target, cap=cap, shards=shards)
                for g in groups]
    return _range_plans(groups, target)


def _estimates(rows: np.ndarray, unions: Sequence[np.ndarray]) -> np.ndarray:
    """:func:`hll_rows` of each chunk's rows shipped and merged registers, the sketched
    ones estimated at once (:func:`.sketch.estimate_many`): per chunk, the estimate was a
    third of a plan's reduce (3,652 day chunks)."""
    est = rows.astype(np.int64).copy()  # not sketched: the rows
    sketched = np.array([len(u) > 0 for u in unions], bool) & (rows > 0)
    if sketched.any():
        guess = np.rint(sketch.estimate_many(np.stack([u for u, s in zip(
            unions, sketched.tolist(), strict=True) if s])))
        est[sketched] = np.maximum(1, np.minimum(rows[sketched], guess.astype(np.int64)))
    return est


def _hashed_plans(groups: Sequence[Sequence[ChunkStats]], *, target: int | None,
                  cap: int | None) -> list[ChunkPlan]:
    """:func:`plan_chunk` of each group merged, for hashed keys without ``numShards``: a
    hashed plan needs of the statistics only the rows, the registers and the daemons, so
    they are merged without a :class:`ChunkStats` a step (:func:`merge`), and the
    estimates made at once."""
    rows = np.array([sum(st.rows for st in g) for g in groups], np.int64)
    est = _estimates(rows, [union([st.regs for st in g]) for g in groups])
    counts = [shard_count(e, target=target, cap=cap) for e in est.tolist()]
    bounds = {n: tuple(hash_bounds(n)) for n in set(counts)}
    return [ChunkPlan(g[0].start, max(st.end for st in g), r, e, bounds[n],
                      tuple(sorted(frozenset().union(*(st.servers for st in g)))))
            for g, r, e, n in zip(groups, rows.tolist(), est.tolist(), counts, strict=True)]


def _range_plans(groups: Sequence[Sequence[ChunkStats]], target: int | None,
                 ) -> list[ChunkPlan]:
    n = len(groups)
    if not n:
        return []
    flat = [st for g in groups for st in g]
    per = np.array([len(g) for g in groups], np.int64)
    first = np.concatenate([[0], np.cumsum(per)[:-1]])
    rates = np.array([st.rate for st in flat], np.float64)
    low, high = np.minimum.reduceat(rates, first), np.maximum.reduceat(rates, first)
    rows = np.add.reduceat(np.array([st.rows for st in flat], np.int64), first)

    # The merged samples, as merge keeps them: per chunk its distinct hashes (a hash's
    # first copy), where the rates differ only those below the lowest rate's threshold,
    # then the PLAN_SAMPLE smallest.
    lengths = np.array([len(st.keys) for st in flat], np.int64)
    chunk = np.repeat(np.repeat(np.arange(n), per), lengths)
    with_keys = [st.keys for st in flat if len(st.keys)]
    keys = pa.concat_arrays(with_keys) if with_keys else _NO_KEYS
    hashes = np.concatenate([st.hashes for st in flat]) if len(keys) else _NO_HASHES
    o, c = _merged_samples(chunk, hashes, low, high)
    counts = np.bincount(c, minlength=n)
    begins = np.concatenate([[0], np.cumsum(counts)[:-1]])
    picked = keys.take(pa.array(o))  # by chunk: now by (chunk, key)
    picked = picked.take(pa.array(slab_keys.chunk_key_order(c, picked)))

    # Each chunk's estimate (as ChunkStats.estimate) and shards.
    exact = (low >= 1.0) & (counts > 0) & (counts < PLAN_SAMPLE)
    est = np.where(rows == 0, 0, counts)
    estimated = np.flatnonzero(~exact & (rows > 0))
    est[estimated] = _estimates(rows[estimated],
                                [union([st.regs for st in groups[i]]) for i in estimated.tolist()])
    shards = np.array([shard_count(e, target=target) for e in est.tolist()], np.int64)

    # range_bounds of each chunk: cut i of k at the distinct key starting nearest rank
    # i * n / k of its sample (the first such), a cut repeating an earlier one dropped.
    m = len(picked)
    starts = np.zeros(m, bool)
    if m:
        starts[0] = True
        starts[1:] = (c[1:] != c[:-1]) | np.asarray(
            pc.not_equal(picked.slice(1), picked.slice(0, m - 1)), dtype=bool)
    group_at = np.flatnonzero(starts)  # where each distinct key starts (global)
    group_chunk = c[group_at]
    g0 = np.searchsorted(group_chunk, np.arange(n), "left")
    g1 = np.searchsorted(group_chunk, np.arange(n), "right")
    cutting = np.flatnonzero((shards > 1) & (counts > 0))
    wanted = shards[cutting] - 1
    pair_chunk = np.repeat(cutting, wanted)
    pair_i = np.arange(len(pair_chunk)) - np.repeat(np.cumsum(wanted) - wanted, wanted) + 1
    want = pair_i * counts[pair_chunk] / shards[pair_chunk]
    lo, hi = g0[pair_chunk], g1[pair_chunk] - 1
    near = np.searchsorted(group_at, begins[pair_chunk] + want)
    cand = np.clip(near[:, None] + np.array([-1, 0, 1]), lo[:, None], hi[:, None])
    dist = np.abs((group_at[cand] - begins[pair_chunk][:, None]) - want[:, None])
    chosen = cand[np.arange(len(cand)), np.argmin(dist, axis=1)]
    at = chosen - lo
    cut_keys = picked.take(pa.array(group_at[chosen])).to_pylist() if len(chosen) else []
    cuts: dict[int, list[bytes]] = {}
    last, held = -1, 0
    for ch, a, key in zip(pair_chunk.tolist(), at.tolist(), cut_keys, strict=True):
        if ch != last:
            last, held = ch, 0
            cuts[ch] = []
        if a > held:
            cuts[ch].append(key)
            held = a

    plans = []
    for i, g in enumerate(groups):
        bounds = _edges(cuts[i]) if i in cuts else [(None, None)]
        servers = frozenset().union(*(st.servers for st in g))
        plans.append(ChunkPlan(g[0].start, max(st.end for st in g), int(rows[i]), int(est[i]),
                               tuple(bounds), tuple(sorted(servers))))
    return plans


def _merged_samples(chunk: np.ndarray, hashes: np.ndarray, low: np.ndarray,
                    high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of the sampled rows (each's chunk, ascending, and hash) the chunks' merged
    samples keep, as :func:`merge` keeps them, in chunk order: per chunk its distinct
    hashes (a hash's first copy), where the rates differ (``low`` != ``high``) only those
    below the lowest rate's threshold, then the PLAN_SAMPLE smallest. Returns their
    positions and chunks.

    A row two tasks shipped has one hash, so its copies are found by the hash alone (an
    Arrow hash table) where no hash is in two chunks; the rows then need no sort unless
    a chunk keeps more than PLAN_SAMPLE. Sorting every row by (chunk, hash) to find them
    was 25 of a reducer's 87 ms (1,826 day chunks of two tasks' samples)."""
    n = len(low)
    mixed = low != high
    below = (np.array([sketch.rate_threshold(r) for r in low.tolist()], np.uint64)
             if mixed.any() else None)
    at = np.arange(len(hashes))
    if len(hashes):
        codes = np.asarray(pc.dictionary_encode(pa.array(hashes, pa.uint64())).indices,
                           np.int64)
        first = np.full(int(codes.max()) + 1, len(hashes), np.int64)
        np.minimum.at(first, codes, at)
        keep = first[codes] == at
        if below is not None:
            keep &= ~mixed[chunk] | (hashes < below[chunk])
        if (chunk[first[codes]] == chunk).all():
            o = np.flatnonzero(keep)
            c = chunk[o]
            if not len(c) or int(np.bincount(c, minlength=n).max()) <= PLAN_SAMPLE:
                return o, c
    o = np.lexsort((hashes, chunk))  # stable: a hash's first copy stays first
    c, h = chunk[o], hashes[o]
    keep = np.ones(len(o), bool)
    keep[1:] = (c[1:] != c[:-1]) | (h[1:] != h[:-1])
    if below is not None:
        keep &= ~mixed[c] | (h < below[c])
    o, c = o[keep], c[keep]
    begins = np.concatenate([[0], np.cumsum(np.bincount(c, minlength=n))[:-1]])
    keep = np.arange(len(c)) - begins[c] < PLAN_SAMPLE
    return o[keep], c[keep]


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
