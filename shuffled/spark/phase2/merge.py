"""Phase 2 on the executors: fetch each assigned partition's committed partials, merge, write.

Each merge task gets whole partitions (:mod:`.plan`) and reads exactly the committed
subtasks' partials of each from their daemons (:mod:`.fetch`: replicas, row counts, lost
daemons reported rather than failing the task). The rows are merged with the combining aggregators, sorted by time then dimensions and written
as one Parquet file straight to its final place under a per-attempt name
(:func:`~.publish.segment_name`); the driver publishes the file named by the attempt whose
result it received, by writing the manifest. Partitions are fetched in batches, one bulk read per
daemon per batch and one batch ahead of the merging, and a task's files are synced together
at its end (:mod:`.durable`). Runs on executors: shuffled.client/protocol + pyarrow.
"""

from __future__ import annotations

import enum
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shuffled.client import ShuffleClient
from shuffled.protocol import PEERS_PATH
from shuffled.spark.phase2.durable import sync_files
from shuffled.spark.phase2.fetch import SourceLost, fetch_batch, stream_partition
from shuffled.spark.phase2.parquetfile.plain import MAX_ROWS as PLAIN_ROWS
from shuffled.spark.phase2.parquetfile.plain import PlainFiles
from shuffled.spark.phase2.plan import (  # noqa: F401  (re-exported: the driver's names)
    Assignment, Phase2Config, assign, balance, merge_tasks,
)
from shuffled.spark.phase2.publish import segment_name
from shuffled.spark.phase2.verdict import Verdict
from shuffled.spark.records import Lost, Segment, dump
from shuffled.spark.rows.memory import peak_rss, reset_peak_rss, rss
from shuffled.spark.phase2.spill import SpillStats, merge_bounded, merge_in_memory
from shuffled.spark.rows.multivalue import LIST_TYPE, decode
from shuffled.spark.rows.rollup import TIME, Layout, combine

_SEGMENT = "__segment"  # which partition of a batch a row belongs to, while merging
COMBINE_MAX_BYTES = 1 << 30  # a batch is sorted as one chunk a column below this
PREFETCH = 1  # batches fetched ahead of the one being merged
BATCH_PARTITIONS = 128  # partitions per batch (one bulk read per daemon)
BATCH_ROWS = 500_000  # about this many rows per batch (bounds a merge task's memory)


def batches(assignments: Iterable[Assignment], partitions: int = BATCH_PARTITIONS,
            rows: int = BATCH_ROWS, nbytes: int = 1 << 62) -> Iterator[list[Assignment]]:
    """Consecutive assignments in batches of at most ``partitions`` and about ``rows``
    rows and ``nbytes`` bytes."""
    batch: list[Assignment] = []
    held = size = 0
    for a in assignments:
        if batch and (len(batch) >= partitions or held + a.rows > rows
                      or size + a.nbytes > nbytes):
            yield batch
            batch, held, size = [], 0, 0
        batch.append(a)
        held += a.rows
        size += a.nbytes
    if batch:
        yield batch


merge_partition = merge_in_memory  # all partials of one partition -> its segment's rows


class Repeats(enum.Enum):
    """What a merge knows of a key repeating within a part (a partition's tables)."""

    #: Anything: the rows are grouped, then sorted.
    ANY = "any"
    #: No key repeats (rolled-up rows whose keys' hashes differ, :mod:`.slabmerge`): the
    #: rows are only sorted. The group-by was 60% of merging such rows.
    NONE = "none"
    #: Few keys repeat (each table rolled up on its own, like a slab's run of a shard):
    #: the rows are sorted, and only runs of equal keys, which the sort puts side by
    #: side, are grouped. A key type the run check cannot compare as the group-by does
    #: (floats, lists) groups everything, as ``ANY``.
    RARE = "rare"


def merge_partitions(parts: Sequence[list[pa.Table]], layout: Layout,
                     finish: Callable[[pa.Table], pa.Table] | None = None,
                     repeats: Repeats = Repeats.ANY) -> list[pa.Table]:
    """:func:`merge_partition` of each of ``parts``, with one group-by and one sort for
    them all: Acero's per-call cost (~0.3 ms) was most of merging a small partition.
    ``finish`` (e.g. :func:`_segment_table`) is applied to the merged rows of them all
    before they are cut, once per batch instead of once per segment. ``repeats``: what is
    known of keys repeating within a part (:class:`Repeats`)."""
    if repeats is Repeats.RARE and not runs_comparable(layout):
        repeats = Repeats.ANY
    if len(parts) == 1 and repeats is Repeats.ANY:
        merged = merge_partition(parts[0], layout)
        return [finish(merged) if finish else merged]
    schema = layout.schema()
    flat = [t for tables in parts for t in tables]
    if all(t.schema.equals(flat[0].schema) for t in flat):  # the usual case: cast once
        table = pa.concat_tables(flat).select(schema.names).cast(schema)
    else:
        table = pa.concat_tables([t.select(schema.names).cast(schema) for t in flat])
    rows = [sum(t.num_rows for t in tables) for tables in parts]
    seg = np.repeat(np.arange(len(parts), dtype=np.int32), rows)
    table = table.add_column(0, _SEGMENT, pa.array(seg))
    if repeats is Repeats.ANY:
        table = combine(table, layout, [_SEGMENT])
    # One chunk a column first: the batch is a table of each of its shards' slabs (~250
    # chunks), and Arrow's sort of a real batch of 52,000 rows took 9.7 ms chunked against
    # 6.9 + 0.5 to combine. (Integer codes, :func:`.rollup.sorted_by`, took 11.8 here: the
    # segment and the hour decide most comparisons before a string does.) Not past 1 GiB:
    # one string chunk holds at most 2 GiB of text.
    # (Buffer sizes: an upper bound of nbytes, whose search for shared buffers over the
    # batch's hundreds of chunks was 158 of 676 samples of this function.)
    if table.get_total_buffer_size() < COMBINE_MAX_BYTES:
        table = table.combine_chunks()
    order = [(k, "ascending", "at_start") for k in [_SEGMENT, *layout.keys]]
    table = table.sort_by(order)
    if repeats is Repeats.RARE:
        table = _fold_runs(table, layout, order)
    counts = np.bincount(table.column(_SEGMENT).to_numpy(), minlength=len(parts))
    table = table.drop_columns([_SEGMENT])
    if finish is not None:
        table = finish(table)
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [table.slice(int(starts[n]), int(counts[n])) for n in range(len(parts))]


def runs_comparable(layout: Layout) -> bool:
    """Whether :func:`_same_as_before` finds the layout's keys equal exactly as the
    group-by does: integers, times and strings. Floats do not (the group-by keeps -0.0
    and 0.0 apart, and NaNs of other bits), nor lists."""
    return all(pa.types.is_integer(f.type) or pa.types.is_timestamp(f.type)
               or pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
               for f in layout.schema() if f.name in layout.keys)


def _same_as_before(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Per row of ``table`` but the first, whether its ``keys`` all equal the row
    before's (two nulls equal, as the group-by takes them)."""
    n = table.num_rows
    same = np.ones(max(n - 1, 0), bool)
    for k in keys:
        if not same.any():
            break
        col = table.column(k)
        now, before = col.slice(1), col.slice(0, n - 1)
        eq = pc.fill_null(pc.equal(now, before), False)
        if col.null_count:
            eq = pc.or_(eq, pc.and_(pc.is_null(now), pc.is_null(before)))
        same &= eq.to_numpy(zero_copy_only=False)
    return same


def _fold_runs(table: pa.Table, layout: Layout, order: list[tuple[str, str, str]],
               ) -> pa.Table:
    """``table`` sorted by ``order`` with each run of rows of equal keys rolled up into
    one, in the run's place: only those rows are grouped (most parts have none; a slab
    shard of the Druid shape, a key in ~30,000). The rest are only sorted."""
    same = _same_as_before(table, [_SEGMENT, *layout.keys])
    if not same.any():
        return table
    n = table.num_rows
    in_run = np.zeros(n, bool)
    in_run[1:] |= same
    in_run[:-1] |= same
    first = in_run.copy()
    first[1:] &= ~same
    # The run's keys, distinct from every other run's, sort the grouped rows as the runs.
    grouped = combine(table.filter(pa.array(in_run)), layout, [_SEGMENT]).sort_by(order)
    kept = np.flatnonzero(~in_run | first)
    starts = np.flatnonzero(first[kept])
    if len(starts) != grouped.num_rows:  # not one group a run: group them all instead
        return combine(table, layout, [_SEGMENT]).sort_by(order)
    take = kept.astype(np.int64)
    take[starts] = n + np.arange(len(starts), dtype=np.int64)
    grouped = grouped.select(table.column_names).cast(table.schema)
    return pa.concat_tables([table, grouped]).take(pa.array(take))


def _segment_table(table: pa.Table, multi_value: Sequence[str] = (),
                   hidden: Sequence[str] = ()) -> pa.Table:
    """Merged rows as the segment stores them: ``__time`` a UTC timestamp, multi-value
    dimensions ``list<string>`` (each single value a one-element list), without the
    ``hidden`` columns (first/last metrics' times)."""
    if hidden:
        table = table.drop_columns(list(hidden))
    ts = table.column(TIME).cast(pa.timestamp("ms", tz="UTC"))
    table = table.set_column(0, pa.field(TIME, pa.timestamp("ms", tz="UTC"), nullable=False), ts)
    for name in multi_value:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, pa.field(name, LIST_TYPE), decode(table.column(i)))
    return table


def encoded(tables: Sequence[pa.Table], cfg: Phase2Config) -> list[bytes | None]:
    """A batch's small segments' files, encoded together (:mod:`.parquetfile.plain`:
    ~0.13 ms a file of comparison 7's shape, pyarrow's writer ~0.19); None for each of the
    others, which :func:`_write` encodes with pyarrow."""
    if not tables:
        return []
    schema = tables[0].schema
    files = PlainFiles.of(schema, cfg.codecs(schema.names))
    return files.encode(tables) if files is not None else [None] * len(tables)


def _write(out: pa.Table, path: str, cfg: Phase2Config, data: bytes | None = None) -> int:
    """Write one segment (rows as :func:`_segment_table` makes them; ``data``: its file
    already encoded, :func:`encoded`), not synced (the task syncs its files together at
    its end; the per-attempt name means a torn file of a failed attempt is never
    published)."""
    if data is None:
        # Encoded in memory, then one write: Arrow's file output stream costs ~0.3 ms
        # more per file, which is most of a small segment's write.
        sink = pa.BufferOutputStream()
        pq.write_table(out, sink, compression=cfg.codecs(out.schema.names),
                       row_group_size=1 << 20, use_dictionary=out.num_rows > PLAIN_ROWS)
        buf = sink.getvalue()
        view = memoryview(buf)
    else:
        view = memoryview(data)
    size = len(view)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return size


class SegmentSink:
    """A segment's Parquet file written as the sorted rows of a bounded merge come (a
    partition, or a shard, too big for one piece within the budget): call it with each
    table; ``rows`` counts them."""

    def __init__(self, cfg: Phase2Config, path: str) -> None:
        self.cfg = cfg
        schema = _segment_table(cfg.layout.schema().empty_table(), cfg.multi_value,
                                cfg.layout.hidden).schema
        self.writer = pq.ParquetWriter(path, schema, compression=cfg.codecs(schema.names))
        self.rows = 0

    def __call__(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        self.writer.write_table(_segment_table(table, self.cfg.multi_value,
                                               self.cfg.layout.hidden), row_group_size=1 << 20)

    def __enter__(self) -> SegmentSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()


def _write_streamed(cfg: Phase2Config, clients: dict[str, ShuffleClient], a: Assignment,
                    path: str, down: set[str], verdict: Verdict | None = None,
                    ) -> tuple[int, int, SpillStats]:
    """Merge a partition too big for one piece within the budget, writing its segment as
    the sorted rows come: returns (rows, bytes written, spill stats)."""
    with SegmentSink(cfg, path) as sink:
        stats = merge_bounded(stream_partition(clients, cfg, a, down, verdict), cfg.layout,
                              cfg.memory_budget, sink, cfg.spill_dir)
    return sink.rows, os.path.getsize(path), stats


Fetched = list[list[pa.Table] | SourceLost]
B = TypeVar("B")
R = TypeVar("R")


def read_ahead(pool: ThreadPoolExecutor, fetch: Callable[[B], R], batches: Iterable[B],
               ) -> Iterator[R]:
    """``fetch`` of each batch, in order, :data:`PREFETCH` batches ahead on ``pool``
    (phase 2's partials and slabs: reading overlaps merging); what is still queued when
    the consumer stops is cancelled."""
    ahead: deque[Future[R]] = deque()
    try:
        for batch in batches:
            ahead.append(pool.submit(fetch, batch))
            if len(ahead) > PREFETCH:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()
    finally:
        for f in ahead:
            f.cancel()


def _prefetched(clients: dict[str, ShuffleClient], cfg: Phase2Config,
                assignments: Iterable[Assignment], pool: ThreadPoolExecutor, down: set[str],
                verdict: Verdict | None = None,
                ) -> Iterator[tuple[list[Assignment], Fetched, float]]:
    """Batches of assignments with their fetched tables and the fetch's seconds, fetched
    one batch ahead on ``pool`` (one thread: it alone uses ``clients``), so that fetching
    overlaps merging and writing (HTTP, IPC reading, Acero and Parquet release the GIL)."""

    def fetch(batch: list[Assignment]) -> tuple[list[Assignment], Fetched, float]:
        started = time.monotonic()
        return batch, fetch_batch(clients, cfg, batch, down, verdict), time.monotonic() - started

    return read_ahead(pool, fetch, batches(assignments, nbytes=cfg.batch_bytes))


def make_phase2(cfg: Phase2Config) -> Callable[[Iterable[Assignment]], Iterator[str]]:
    """The ``mapPartitions`` function of phase 2 (input: Assignments; output: JSON lines)."""

    def run(assignments: Iterable[Assignment]) -> Iterator[str]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.taskAttemptId() if ctx else 0
        cfg.hooks.task_started()  # no release of earlier tasks' pages: phase1.tasks.run_task
        reset_peak_rss()
        baseline = rss()  # the worker before this task: the interpreter, pyarrow, ...
        clients: dict[str, ShuffleClient] = {}
        written: list[str] = []
        todo = list(assignments)
        large = [a for a in todo if cfg.streams(a)]
        pool = ThreadPoolExecutor(1, thread_name_prefix="phase2-fetch")

        def result(a: Assignment, path: str, rows: int, size: int, fetched: int,
                   fetch_s: float, merge_s: float, write_s: float, peak: int,
                   **extra: Any) -> str:
            written.append(path)
            return dump(Segment(
                start=a.start, end=a.end, partition=a.partition, rows=rows, rows_in=a.rows,
                bytes=size, path=path, attempt=attempt, bytes_fetched=fetched,
                # Where the partition's time went (summed in the task report).
                fetch_ms=fetch_s * 1000, merge_ms=merge_s * 1000, write_ms=write_s * 1000,
                ms=int((fetch_s + merge_s + write_s) * 1000), peak_rss=peak,
                rss_at_start=baseline,
                from_tier=tuple(sorted(s for s in clients if PEERS_PATH in s)), **extra))

        def lost(a: Assignment, exc: SourceLost) -> str:
            # Not a failure of the task: the driver recomputes what was lost and merges
            # this partition again (docs/failover.md).
            cfg.hooks.phase2_lost(a.partition, exc.servers, exc.why)
            return dump(Lost(start=a.start, end=a.end, partition=a.partition, attempt=attempt,
                             lost=tuple(exc.servers), missing=tuple(exc.missing), why=exc.why))

        down = set(cfg.lost)  # daemons this task found gone: not asked again
        # Asked only when a read fails: has the driver declared that daemon lost?
        verdict = Verdict(cfg.supervisor_task_id, cfg.servers, down, token=cfg.token,
                          ca_file=cfg.ca_file)
        try:
            small = (a for a in todo if not cfg.streams(a))
            n_batch = 0
            for fetched_batch, fetched, fetch_s in _prefetched(clients, cfg, small, pool, down,
                                                               verdict):
                n_batch += 1
                for a, got in zip(fetched_batch, fetched, strict=True):
                    if isinstance(got, SourceLost):
                        yield lost(a, got)
                cfg.hooks.phase2_fetched(n_batch)
                kept = [(a, t) for a, t in zip(fetched_batch, fetched, strict=True)
                        if not isinstance(t, SourceLost)]
                if not kept:
                    continue
                batch = [a for a, _ in kept]
                tables = [t for _, t in kept]
                merge_started = time.monotonic()
                merged_all = merge_partitions(tables, cfg.layout, lambda t: _segment_table(
                    t, cfg.multi_value, cfg.layout.hidden))
                merge_s = (time.monotonic() - merge_started) / len(batch)
                peak = peak_rss()  # once a batch: /proc reads were 3% of tiny partitions' time
                write_started = time.monotonic()
                files = encoded(merged_all, cfg)
                encode_s = (time.monotonic() - write_started) / len(batch)
                for a, merged, data in zip(batch, merged_all, files, strict=True):
                    write_started = time.monotonic() - encode_s
                    path = os.path.join(cfg.segment_dir, segment_name(a.start, a.end, a.partition, attempt))
                    size = _write(merged, path, cfg, data)
                    # The bytes read are the partials as shipped (as for a streamed
                    # partition): Table.nbytes of the decoded tables cost 2 s of comparison
                    # 7's phase 2 (bench.units) and counted decompressed bytes.
                    yield result(a, path, merged.num_rows, size, a.nbytes,
                                 fetch_s / len(batch), merge_s, time.monotonic() - write_started,
                                 peak)
            for n, a in enumerate(large):  # one at a time, streamed: fetch, merge, write
                if n:
                    cfg.hooks.phase2_fetched(n_batch + n)
                started = time.monotonic()
                path = os.path.join(cfg.segment_dir, segment_name(a.start, a.end, a.partition, attempt))
                try:
                    rows, size, spilled = _write_streamed(cfg, clients, a, path, down, verdict)
                except SourceLost as exc:
                    os.unlink(path)  # a torn segment: never published, not kept
                    yield lost(a, exc)
                    continue
                yield result(a, path, rows, size, a.nbytes, 0.0, time.monotonic() - started,
                             0.0, peak_rss(), spill_files=spilled.files, spill_bytes=spilled.bytes)
            # Durable before the task ends, so before the driver can publish any of them:
            # Spark hands the driver a task's results only once the task has succeeded.
            if written:
                sync_files(written, [cfg.segment_dir])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for c in clients.values():
                c.close()
            verdict.close()

    return run
