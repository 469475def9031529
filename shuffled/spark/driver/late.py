"""The late plan's driver steps (issue 36, docs/slab.md): a spec Druid users write
(``hashed`` or ``range``/``single_dim`` with ``targetRowsPerSegment`` or
``maxRowsPerSegment`` and no ``numShards``) ingested in ONE pass over the input.

Phase 1 writes each flush as a slab without knowing the shard count; each task merges its
slabs' statistics per time chunk and yields them beside its result lines, a columnar block
per reducer (:mod:`shuffled.spark.phase2.statblock`); one Spark job then merges them per
chunk on the executors (each chunk's reducer chosen by :func:`reducer_of`) and
plans each chunk's shards there (:mod:`shuffled.spark.phase2.shardplan`): the driver
collects the task results (a line per slab) and the plan (bounded by the shards), never
the statistics.
Phase 2 reads each shard, a key range of its chunk, from the daemons holding the chunk's
slabs (:mod:`shuffled.spark.phase2.slabmerge`).

Taken only where it holds today's guarantees for less: the native reader (the JVM reader
keeps the determine pass: its rows reach Python through the data source sink, whose
commit messages carry no statistics). A lost daemon's slabs are read from another copy
(``shuffleReplicas`` > 1), or from its copy in deep storage through a survivor's peer
route (``shuffleDurability`` deep, or a copy already complete), or made again by
re-running the subtasks that stored them (:mod:`.late_recompute`). Anything else falls
back to :func:`shuffled.spark.phase1.determine.determine` and the partials.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa

from shuffled.slab.build import Slab
from shuffled.spark import records
from shuffled.spark.driver import late_recompute
from shuffled.spark.driver.failed import IngestionFailed
from shuffled.spark.driver.late_recompute import CommittedSlabs
from shuffled.spark.driver.report import counted, size
from shuffled.spark.phase1 import tasks as phase1
from shuffled.spark.phase1.config import Keying, Phase1Config
from shuffled.spark.phase1.native import reader as native
from shuffled.spark.phase1.native.text.blocks import Declined
from shuffled.spark.phase2 import shardplan, statblock
from shuffled.spark.phase2.slabmerge import Shard, balance, make_phase2_slabs
from shuffled.spark.rows.rollup import TIME
from shuffled.spark.spec.model import IngestSpec, PartitionPlan

#: The driver's :class:`shuffled.spark.driver.job.Job` (typed loosely: it imports this).
Job = Any

log = logging.getLogger("shuffled.spark")

ROWS_PER_MERGE_TASK = 2_000_000


def keying(spec: IngestSpec, reader: str) -> Keying | str:
    """How slabs are keyed for ``spec``, or why the late plan is not taken."""
    ps = spec.partitions
    if ps.type not in ("hashed", "range", "single_dim"):
        return f"{ps.type} partitioning"
    if reader == "jvm":
        return "the JVM reader was asked for (it keeps the determine pass)"
    if ps.type == "hashed":
        # numShards: the plan is known up front, and slabs keyed by partition carry it
        # (docs/slab.md, "The plan"): one format for the data plane whatever the spec.
        return Keying("hashed", tuple(ps.dimensions or (TIME, *spec.dimension_names)),
                      ps.num_shards or None)
    # targetRowsPerSegment places bounds from a sample at a rate (a few dozen keys a
    # shard); maxRowsPerSegment, a hard cap, keeps every key up to the sample's size.
    rate = (min(1.0, shardplan.KEYS_PER_SHARD / ps.target_rows)
            if ps.target_rows and not ps.max_rows else 1.0)
    return Keying("range", tuple(ps.dimensions), sample_rate=rate)


def placeholder(spec: IngestSpec, keyed: Keying) -> PartitionPlan:
    """The plan phase 1's native input is built with (its bucketer is not used by slabs)."""
    return PartitionPlan("hashed" if keyed.kind == "hashed" else "range",
                         spec.partitions.dimensions, num_shards=1)


def _goal(spec: IngestSpec) -> dict[str, int]:
    ps = spec.partitions
    if ps.num_shards:
        return {"shards": ps.num_shards}
    return {"cap": ps.max_rows} if ps.max_rows else {"target": ps.target_rows}


#: A chunk's statistics a reducer holds unmerged, at most: past it they are merged into one.
FOLD_AT = 8


_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / phi: Fibonacci hashing's multiplier
_MASK64 = (1 << 64) - 1


def reducer_of(key: tuple[str, int]) -> int:
    """The late plan's partitioner: a ``("c", chunk start)`` or ``("t", task)`` key's
    reducer, before ``% reducers``. Fibonacci hashing, the top 32 bits of the value times
    2^64 / phi: PySpark's ``portable_hash`` keeps a tuple's low bits as its elements'
    are, and a day chunk's start in milliseconds is a multiple of 1,024, so with a
    power-of-two count of reducers it sent every chunk to one of them
    (tests/spark/slab/test_late_reducers.py)."""
    return ((int(key[1]) * _GOLDEN) & _MASK64) >> 32


def _chunk_reducer(start: int) -> int:
    return reducer_of(("c", start))


def partition_of(key: tuple[str, int]) -> int:
    """The partitioner of the late plan's shuffle: a task's lines (``("t", task)``) by
    :func:`reducer_of`; a block of a task's chunk statistics (``("b", reducer)``,
    :func:`.statblock.by_reducer`, its chunks chosen by :func:`reducer_of`) to its
    reducer."""
    return int(key[1]) if key[0] == "b" else reducer_of(key)


def run_phase1(job: Job, keyed: Keying, ninput: native.NativeInput,
               tasks: list[list[native.Split]],
               ) -> tuple[list[str], list[shardplan.ChunkPlan]]:
    """Phase 1 over slabs and the plan, in one Spark job: each task's result lines, and
    each chunk's shards (planned on the executors)."""
    cfg: Phase1Config = replace(job.ctx.phase1_config(job.may_be_multi), slabs=keyed)
    sc = job.spark.sparkContext
    rows = job.ctx.rows.acc if job.ctx.rows is not None else None
    shuffled = job.ctx.rows.shuffled if job.ctx.rows is not None else None
    kind, goal = keyed.kind, _goal(job.spec)
    # The reducers: run, below, sends each one block of its chunks (statblock.by_reducer).
    reducers = max(1, sc.defaultParallelism, len(tasks))

    def run(index: int, it: Iterable[list[native.Split]]) -> Iterator[tuple[Any, Any]]:
        merged: dict[int, shardplan.ChunkStats] = {}

        def on_slab(slab: Slab, server: str, sample: Any) -> None:  # the upload thread
            table = pa.ipc.open_stream(pa.py_buffer(slab.stats)).read_all()
            for st in shardplan.from_stats(table, server, sample, slab.registers):
                have = merged.get(st.start)
                merged[st.start] = st if have is None else shardplan.merge(have, st)

        try:
            lines = phase1.run_native_task(cfg, ninput, (x for t in it for x in t), on_slab)
        except Declined as exc:  # the JVM reads it again (job.phase1)
            yield ("t", index), [records.dump(records.Declined(str(exc)))]
            return
        if rows is not None and shuffled is not None:
            stats = records.load(lines[-1])
            if isinstance(stats, records.TaskStats):
                rows.add(stats.rows_in)
                shuffled.add(stats.bytes_shuffled)
        yield ("t", index), lines
        for r, block in statblock.by_reducer(merged.values(), reducers, _chunk_reducer):
            yield ("b", r), block

    def reduce(kvs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
        # A key comes once from each task (a task merged its chunks itself): no map-side
        # combine, and no ExternalMerger: past spark.python.worker.memory (a phase-1
        # worker is) it spilled every record, pickled and zlib-compressed, before the
        # shuffle did it again (range: ~1/4 of phase 1's CPU). A reducer holds each of its
        # chunks' statistics as the tasks sent them, at most FOLD_AT (each bounded,
        # ChunkStats), and plans them all at once (shardplan.plan_chunks).
        lines: dict[Any, list[str]] = {}
        held: dict[Any, list[shardplan.ChunkStats]] = {}
        for key, value in kvs:
            if key[0] == "t":  # a task's lines: one map output per task, never two
                lines[key] = lines.get(key, []) + value
                continue
            for st in value.stats():  # a task's chunks of this reducer (statblock)
                group = held.setdefault(st.start, [])
                group.append(st)
                if len(group) >= FOLD_AT:
                    held[st.start] = [functools.reduce(shardplan.merge, group)]
        yield from lines.items()
        groups = list(held.values())
        held.clear()
        for plan in shardplan.plan_chunks(groups, kind, **goal):
            yield ("c", plan.start), plan

    got = (sc.parallelize(tasks, len(tasks)).mapPartitionsWithIndex(run)
           .partitionBy(reducers, partition_of).mapPartitions(reduce).collect())
    lines = [line for key, value in sorted(got, key=lambda kv: kv[0])
             if key[0] == "t" for line in value]
    plans = sorted((v for k, v in got if k[0] == "c"), key=lambda p: p.start)
    return lines, plans


def partition_plan(spec: IngestSpec, keyed: Keying,
                   plans: list[shardplan.ChunkPlan]) -> PartitionPlan:
    """The late plan as the manifest's shardSpecs read it."""
    dims = spec.partitions.dimensions
    if keyed.num_shards:  # today's shardSpec: pmod of the hash
        return PartitionPlan("hashed", dims, num_shards=keyed.num_shards)
    if keyed.kind == "hashed":
        ranges = {p.start: [(shardplan.hash_of_bound(lo), shardplan.hash_of_bound(hi))
                            for lo, hi in p.bounds] for p in plans}
        return PartitionPlan("hashed", dims, num_shards=1,
                             per_chunk={p.start: p.shards for p in plans}, hash_ranges=ranges)
    bounds: dict[int, list[tuple[str | None, ...]]] = {}
    for p in plans:
        cuts = [shardplan.tuple_of_bound(lo) for lo, _ in p.bounds[1:]]
        bounds[p.start] = [tuple(c) for c in cuts if c is not None]
    return PartitionPlan("range", dims, boundaries=bounds)


def phase2(job: Job, keyed: Keying, slabs: CommittedSlabs,
           plans: list[shardplan.ChunkPlan]) -> list[records.Segment]:
    """Merge every shard of the plan. A shard a daemon could not serve whole is merged
    again once the daemon is back, or after its slabs' subtasks ran again on the survivors
    (:mod:`.late_recompute`). Checks the rows read against phase 1's."""
    ctx = job.ctx
    ctx.enter("phase 2 (merge)")
    if ctx.rows is not None:
        ctx.rows.start()
    started = time.monotonic()
    shards = _shards(job, keyed, plans, slabs)
    if not shards:
        job.report.phase("partialSegmentMerge", started, tasks=0, partitions=0)
        job.say("phase 2: no rows to merge")
        return []
    total_rows = sum(p.rows for p in plans)
    tasks = job.spec.total_merge_tasks
    cores = job.spark.sparkContext.defaultParallelism
    if tasks is None:
        wanted = -(-total_rows // ROWS_PER_MERGE_TASK)
        tasks = max(1, min(len(shards), max(cores, min(wanted, 4 * cores))))
    job.say(f"phase 2: merging {counted(len(shards), 'shard')} in "
            f"{counted(min(tasks, len(shards)), 'task')}")
    os.makedirs(ctx.staging, exist_ok=True)
    done: dict[tuple[int, int], records.Segment] = {}
    todo = shards
    for round_ in range(len(ctx.servers) + 1):
        results, lost = _merge(job, slabs, todo, tasks)
        done.update({(r.start, r.partition): r for r in results})
        if not lost:
            break
        again = time.monotonic()
        servers = sorted({s for r in lost for s in r.lost})
        job.say(f"phase 2: {counted(len(lost), 'shard')} could not be read from "
                f"{', '.join(servers)}")
        # A route to a lost daemon's copy in deep storage that could not be read: that
        # copy is given up (its subtasks are re-run below).
        daemons = set(late_recompute.lost_routes(job, {x for r in lost for x in r.lost}))
        for r in lost:  # answered holding fewer slabs than committed there: data gone
            for server in (x for x in r.missing if x in daemons):
                ctx.lost.setdefault(server, f"lacks committed slabs: {r.why}")
                job.recovery.lost.setdefault(server, ctx.lost[server])
        superseded, kept = len(slabs.superseded), {id(sl) for sl in slabs.kept}
        plans = late_recompute.sealed(job, keyed, slabs, plans, "during phase 2")
        ctx.enter("phase 2 (merge)")
        again_keys = {(r.start, r.partition) for r in lost}
        # Subtasks run again: every shard of a chunk their slabs (old or new) hold is
        # merged again from the slabs now kept. A shard merged before read the superseded
        # slabs, and a re-run flushes where its memory says (other rows shipped, folded
        # alike), so results from both sets are each exact but add up to neither set's
        # rows: the check below could not tell a lost slab from that (it failed a good
        # ingestion, tests/spark/phase2/test_phase2_verdict.py's slabs case).
        touched = _spans([*slabs.superseded[superseded:],
                          *(sl for sl in slabs.kept if id(sl) not in kept)])
        todo = [s for s in _shards(job, keyed, plans, slabs)
                if (s.start, s.partition) in again_keys or _within(s.start, touched)]
        job.recovery.round("phase 2 re-merge", again, partitionsRemerged=len(todo),
                           round=round_ + 1)
    else:
        raise IngestionFailed("phase 2 could not read every shard after recovering: "
                              f"{lost[0].why}")
    results = [done[(s.start, s.partition)] for s in shards]
    read: dict[int, int] = {}
    for seg in results:
        read[seg.start] = read.get(seg.start, 0) + seg.rows_in
    if slabs.superseded:  # a re-run flushes where its memory says: compared in total
        if sum(read.values()) != slabs.rows:
            raise IngestionFailed(f"phase 2 read {sum(read.values()):,} rows; the slabs "
                                  f"kept hold {slabs.rows:,}: a daemon lost slabs")
    else:
        expected = {p.start: p.rows for p in plans if p.rows}
        if read != expected:
            short = sorted(c for c in expected if read.get(c) != expected[c])[:3]
            raise IngestionFailed("phase 2 read other rows than phase 1 stored (chunks "
                                  f"{short}): a daemon lost slabs")
    results = [r for r in results if r.path]  # numShards: an empty partition, no segment
    report = job.report
    report.rows_out = sum(r.rows for r in results)
    report.bytes_fetched = sum(r.bytes_fetched for r in results)
    spent = {f"{k}Seconds": round(sum(getattr(r, f"{k}_ms") for r in results) / 1000, 3)
             for k in ("fetch", "merge", "write")}
    spilled = [r for r in results if r.spill_files is not None]
    report.phase("partialSegmentMerge", started, tasks=min(tasks, len(shards)),
                 partitions=len(results), rowsOut=report.rows_out, **spent,
                 memoryBudgetBytes=job.spec.max_bytes_in_memory or None,
                 peakTaskRssBytes=max((r.peak_rss for r in results), default=0),
                 peakTaskRssGrowthBytes=max((r.peak_rss - r.rss_at_start for r in results),
                                            default=0),
                 partitionsSpilled=len(spilled),
                 shardsReadInPages=sum(1 for r in results if r.pages > 1),
                 spillBytes=sum(r.spill_bytes or 0 for r in spilled))
    ctx.settle()
    job.say(f"phase 2 done: {counted(len(results), 'segment')}, "
            f"{counted(report.rows_out, 'row')}")
    return results


Span = tuple[int, int]  # the starts of a slab's first and last time chunk


def _spans(slabs: list[records.SlabSent]) -> list[Span] | None:
    """The chunk spans ``slabs`` hold; None (every chunk) if one of them does not say."""
    spans = []
    for sl in slabs:
        if sl.first_chunk is None or sl.last_chunk is None:
            if sl.rows:
                return None
            continue
        spans.append((sl.first_chunk, sl.last_chunk))
    return spans


def _within(chunk: int, spans: list[Span] | None) -> bool:
    return spans is None or any(lo <= chunk <= hi for lo, hi in spans)


def _shards(job: Job, keyed: Keying, plans: list[shardplan.ChunkPlan],
            slabs: CommittedSlabs) -> list[Shard]:
    """Every shard of the plan, read from the daemons its chunk's slabs are read from
    (with replicas every reading daemon: a chunk's statistics name only first copies; a
    lost daemon read from deep storage, through its route). With numShards an empty
    partition is no segment."""
    readers = set(slabs.readers)
    replicated = any(sl.replicas for sl in slabs.kept)
    per_row = row_bytes(job, slabs)
    # numShards keys are (partition, hash), the late hashed plan's the hash: both cut into
    # narrower ranges where a shard outgrows a merge task's memory budget.
    width = 8 if keyed.num_shards else 4 if keyed.kind == "hashed" else 0
    out = []
    for p in plans:
        if not p.rows:
            continue
        held = {slabs.via.get(server, server) for server in p.servers}  # a lost one's route
        servers = tuple(sorted(readers if replicated else held & readers))
        nbytes = int(per_row * p.rows / max(p.shards, 1))
        out += [Shard(p.start, p.end, i, lo, hi, servers, p.estimate // max(p.shards, 1),
                      written_empty=not keyed.num_shards, nbytes=nbytes, key_width=width)
                for i, (lo, hi) in enumerate(p.bounds)]
    return out


def row_bytes(job: Job, slabs: CommittedSlabs) -> float:
    """Bytes a shipped row takes as Arrow holds it, on average (phase 1's figures: its
    bytes before compression, or the slabs' bytes, over the rows it shipped)."""
    phase1 = job.report.phases.get("partialSegmentGeneration", {})
    rows = phase1.get("rowsShipped") or sum(s.rows for s in slabs.kept)
    size = phase1.get("bytesBeforeCompression") or sum(s.bytes for s in slabs.kept)
    return size / rows if rows else 0.0


def _merge(job: Job, slabs: CommittedSlabs, shards: list[Shard], tasks: int,
           ) -> tuple[list[records.Segment], list[records.Lost]]:
    """One Spark job merging ``shards`` in about ``tasks`` balanced tasks."""
    ctx = job.ctx
    groups = balance(shards, tasks)
    fn = make_phase2_slabs(ctx.phase2_config(tuple(sorted(job.multi_value))), slabs.counts(),
                           slabs.without())
    acc = ctx.rows.acc if ctx.rows is not None else None

    def run(it: Iterable[list[Shard]]) -> Iterator[str]:
        for line in fn(s for g in it for s in g):
            if acc is not None:
                done = records.load(line)
                acc.add(done.rows if isinstance(done, records.Segment) else 0)
            yield line

    got = [records.load(x) for x in
           job.spark.sparkContext.parallelize(groups, len(groups)).mapPartitions(run).collect()]
    return ([r for r in got if isinstance(r, records.Segment)],
            [r for r in got if isinstance(r, records.Lost)])


def describe(plans: list[shardplan.ChunkPlan], slabs: list[records.SlabSent]) -> str:
    shards = shardplan.total_shards(plans)
    return (f"late plan: {counted(len(plans), 'time chunk')}, {counted(shards, 'shard')} "
            f"from {counted(len(slabs), 'slab')} ({size(sum(s.bytes for s in slabs))})")
