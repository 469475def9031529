"""Partition determination (the seed's "partition determine task"), JVM-side.

When ``numShards`` is absent, one aggregation over the prepared rows estimates, per time
chunk, the cardinality of the rolled-up key (``__time`` + all dimensions) with Spark's
HyperLogLog++ (``approx_count_distinct`` over a 64-bit xxhash of the key). Hashed
partitioning then uses ``ceil(cardinality / targetRows)`` shards in that chunk.

Range partitioning needs boundaries: a second pass keeps a *distinct-key sample* (rows whose
key hash falls under a per-chunk threshold, so each rolled-up key is in or out as a whole,
sized to ~``_SAMPLE_PER_SHARD`` keys per wanted shard), deduplicates it, and the driver takes
the quantiles of the range-dimension tuples as boundaries. Only the sample reaches the driver.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shuffled.spark.spec.model import IngestSpec, PartitionPlan
from shuffled.spark.rows.rollup import BAD, CHUNK, TIME, WITH_ERROR

_SAMPLE_PER_SHARD = 400
_MIN_SAMPLE = 4000
_SCALE = 1 << 20


def key_hash(spec: IngestSpec) -> Column:
    """64-bit hash of the rolled-up key; nulls are distinguished from every value."""
    parts: list[Column] = [F.col(TIME)]
    for d in spec.dimension_names:
        c = F.col(f"`{d}`").cast("string")
        parts += [F.coalesce(c, F.lit("")), c.isNull()]
    return F.xxhash64(*parts)


def cardinalities(good: DataFrame, spec: IngestSpec) -> dict[int, int]:
    """Approximate count of distinct rolled-up keys per time chunk (rows if no rollup)."""
    if spec.rollup:
        agg = F.approx_count_distinct(key_hash(spec), 0.02)
    else:
        agg = F.count(F.lit(1))
    rows = good.groupBy(CHUNK).agg(agg.alias("n")).collect()
    return {int(r[CHUNK]): int(r["n"]) for r in rows}


def determine(prepared: DataFrame, spec: IngestSpec) -> tuple[PartitionPlan, dict[int, int]]:
    """The partition plan for ``prepared`` rows, and the per-chunk cardinalities used."""
    ps = spec.partitions
    if ps.type == "hashed" and ps.num_shards:
        return PartitionPlan("hashed", ps.dimensions, num_shards=ps.num_shards), {}
    good = prepared.where(F.col(BAD).isNull() | F.col(BAD).startswith(WITH_ERROR))
    card = cardinalities(good, spec)
    shards = {c: max(1, math.ceil(n / ps.target_rows)) for c, n in card.items()}
    if ps.type in ("hashed", "dynamic"):
        return PartitionPlan("hashed", ps.dimensions, num_shards=1, per_chunk=shards), card
    wanted = {c: k for c, k in shards.items() if k > 1}
    if not wanted:
        return PartitionPlan("range", ps.dimensions, boundaries={}), card
    samples = _sample(good, spec, {c: card[c] for c in wanted}, wanted)
    bounds = {c: boundaries(samples.get(c, []), k) for c, k in wanted.items()}
    return PartitionPlan("range", ps.dimensions, boundaries=bounds), card


def _sample(good: DataFrame, spec: IngestSpec, card: dict[int, int],
            shards: dict[int, int]) -> dict[int, list[tuple[str | None, ...]]]:
    thresholds = []
    for c, n in card.items():
        size = max(_MIN_SAMPLE, _SAMPLE_PER_SHARD * shards[c])
        thresholds += [F.lit(c), F.lit(min(_SCALE, math.ceil(_SCALE * size / max(n, 1))))]
    limit = F.element_at(F.create_map(*thresholds), F.col(CHUNK))
    h = key_hash(spec)
    dims = spec.partitions.dimensions
    picked = (good.where(F.col(CHUNK).isin(list(card)))
              .withColumn("__h", h)
              .where(F.pmod(F.col("__h"), F.lit(_SCALE)) < limit)
              .groupBy(CHUNK, "__h")
              .agg(*[F.first(F.col(f"`{d}`").cast("string"), ignorenulls=False).alias(f"d{i}")
                     for i, d in enumerate(dims)]))
    out: dict[int, list[tuple[str | None, ...]]] = {}
    for row in picked.toLocalIterator():
        out.setdefault(int(row[CHUNK]), []).append(tuple(row[f"d{i}"] for i in range(len(dims))))
    return out


def _order(values: tuple[str | None, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple((v is not None, v or "") for v in values)


def boundaries(sample: Sequence[tuple[str | None, ...]], shards: int) -> list[tuple[str | None, ...]]:
    """``shards - 1`` (or fewer, if values repeat) increasing split points of ``sample``."""
    if shards <= 1 or not sample:
        return []
    ordered = sorted(sample, key=_order)
    out: list[tuple[str | None, ...]] = []
    for i in range(1, shards):
        candidate = ordered[(i * len(ordered)) // shards]
        if (not out or _order(candidate) > _order(out[-1])) and _order(candidate) > _order(ordered[0]):
            out.append(candidate)
    return out
