"""Druid-style ``shardSpec`` of each published segment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from shuffled.spark.records import Segment
from shuffled.spark.spec.differences import HASH_FUNCTION, HASH_RANGE_FUNCTION
from shuffled.spark.spec.model import IngestSpec, PartitionPlan

# Spark's hash(): Murmur3 x86_32, seed 42 (docs/differences-from-druid.md)


def renumbered(spec: IngestSpec, staged: list[Segment]) -> list[Segment]:
    """For ``dynamic`` specs, the partitions of each interval renumbered 0..n-1 (numbered
    shard specs must be contiguous; ``bucket`` keeps the old number); else ``staged``."""
    if spec.partitions.type != "dynamic":
        return staged
    by_iv: dict[tuple[int, int], list[Segment]] = {}
    for s in staged:
        by_iv.setdefault((s.start, s.end), []).append(s)
    return [replace(s, bucket=s.partition, partition=i) for items in by_iv.values()
            for i, s in enumerate(sorted(items, key=lambda x: x.partition))]


def shard_spec_builder(spec: IngestSpec, plan: PartitionPlan,
                       staged: list[Segment]) -> Callable[[Segment, int], dict[str, Any]]:
    """A ``(segment, partition offset) -> shardSpec`` function for :func:`publish`, over
    the segments as :func:`renumbered` gives them."""
    kind = spec.partitions.type
    counts: dict[tuple[int, int], int] = {}
    for s in staged:
        counts[(s.start, s.end)] = counts.get((s.start, s.end), 0) + 1

    def build(s: Segment, offset: int) -> dict[str, Any]:
        num = s.partition + offset
        if offset or kind == "dynamic":
            return {"type": "numbered", "partitionNum": num,
                    "partitions": counts[(s.start, s.end)]}
        shards = plan.shards(s.start)
        ranges = plan.hash_ranges.get(s.start)
        if kind == "hashed" and ranges is not None:  # the late plan: a range of the hash
            lo, hi = ranges[num]
            return {"type": "hashed", "partitionNum": num, "partitions": shards,
                    "numCorePartitions": shards,
                    "partitionDimensions": list(spec.partitions.dimensions),
                    "partitionFunction": HASH_RANGE_FUNCTION, "start": lo, "end": hi}
        if kind == "hashed":
            return {"type": "hashed", "partitionNum": num, "partitions": shards,
                    "numCorePartitions": shards,
                    "partitionDimensions": list(spec.partitions.dimensions),
                    "partitionFunction": HASH_FUNCTION}
        bounds = plan.boundaries.get(s.start, [])
        start = list(bounds[num - 1]) if num > 0 and bounds else None
        end = list(bounds[num]) if num < len(bounds) else None
        if kind == "single_dim":
            return {"type": "single", "dimension": spec.partitions.dimensions[0],
                    "start": start[0] if start else None, "end": end[0] if end else None,
                    "partitionNum": num, "numCorePartitions": shards}
        return {"type": "range", "partitionDimensions": list(spec.partitions.dimensions),
                "start": start, "end": end, "partitionNum": num, "numCorePartitions": shards}

    return build
