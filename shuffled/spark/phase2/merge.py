"""Phase 2 on the executors: fetch each assigned partition's committed partials, merge, write.

Each merge task gets whole partitions. For every daemon holding part of a partition it asks
for exactly the committed subtasks' partials (bulk partition reads with subtask filters,
the client retries with backoff) and checks the row count against what phase 1 reported. The
rows are merged with the combining aggregators, sorted by time then dimensions and written
as one Parquet file under a per-attempt staging name; the driver publishes the file named by
the attempt whose result it received. Partitions are fetched in batches, one bulk read per
daemon per batch and one batch ahead of the merging, and a task's files are synced together
at its end (:mod:`.durable`). Runs on executors: shuffled.client/protocol + pyarrow.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartitionKey
from shuffled.spark.phase2.durable import sync_files
from shuffled.spark.rows.memory import peak_rss, release_free_memory, reset_peak_rss, rss
from shuffled.spark.phase2.spill import WORK_FACTOR, SpillStats, merge_bounded, merge_in_memory
from shuffled.spark.rows.multivalue import LIST_TYPE, decode
from shuffled.spark.rows.rollup import TIME, Layout, combine, from_ipc, sort_segment

_IDS_PER_REQUEST = 64
_SEGMENT = "__segment"  # which partition of a batch a row belongs to, while merging
PREFETCH = 1  # batches fetched ahead of the one being merged
BATCH_PARTITIONS = 128  # partitions per batch (one bulk read per daemon)
BATCH_ROWS = 500_000  # about this many rows per batch (bounds a merge task's memory)


@dataclass(frozen=True)
class Phase2Config:
    """Everything a merge task needs; pickled into the Spark closure. ``memory_budget`` is
    the spec's maxBytesInMemory (0: unbounded); ``spill_dir`` where a partition bigger
    than it spills (None: the system's temporary directory)."""

    supervisor_task_id: str
    layout: Layout
    staging_dir: str
    token: str | None = None
    ca_file: str | None = None
    memory_budget: int = 0
    spill_dir: str | None = None
    multi_value: tuple[str, ...] = ()  # dimensions written as list<string> (rows.multivalue)

    def streams(self, a: Assignment) -> bool:
        """Whether ``a`` is merged by streaming within the budget, not in one piece."""
        return bool(self.memory_budget) and a.nbytes > self.memory_budget // WORK_FACTOR

    @property
    def page_bytes(self) -> int:
        """Page size of a streamed partition's paged reads: a page and its table are held
        while the merge works, so a small share of the budget."""
        return max(1 << 20, min(8 << 20, self.memory_budget // (4 * WORK_FACTOR)))

    @property
    def batch_bytes(self) -> int:
        """Bytes of partials fetched per batch: one batch is merged while the next is
        fetched, and a merge peaks at WORK_FACTOR times its input."""
        return self.memory_budget // (2 * WORK_FACTOR) if self.memory_budget else 1 << 62


@dataclass(frozen=True)
class Assignment:
    """One output partition: where its committed partials are and how many rows they hold."""

    start: int
    end: int
    partition: int
    sources: tuple[tuple[str, tuple[str, ...], int], ...]  # (server, sub ids, rows there)
    nbytes: int = 0  # bytes of its partials as phase 1 shipped them

    @property
    def rows(self) -> int:
        return sum(s[2] for s in self.sources)


def _client(clients: dict[str, ShuffleClient], cfg: Phase2Config, server: str) -> ShuffleClient:
    client = clients.get(server)
    if client is None:
        client = clients[server] = ShuffleClient(server, token=cfg.token, ca_file=cfg.ca_file)
    return client


def _fetch(clients: dict[str, ShuffleClient], cfg: Phase2Config,
           batch: Sequence[Assignment]) -> list[list[pa.Table]]:
    """The partials of every assignment of ``batch``: one bulk read per daemon for the
    lot (``get_partitions``), subtask ids :data:`_IDS_PER_REQUEST` at a time. Checks each
    daemon's row count per partition against what phase 1 reported."""
    asked: dict[str, list[tuple[int, PartitionKey, tuple[str, ...]]]] = {}
    for n, a in enumerate(batch):
        key = PartitionKey(cfg.supervisor_task_id, Interval(a.start, a.end), a.partition)
        for server, subs, _ in a.sources:
            for i in range(0, len(subs), _IDS_PER_REQUEST):
                asked.setdefault(server, []).append((n, key, subs[i:i + _IDS_PER_REQUEST]))
    tables: list[list[pa.Table]] = [[] for _ in batch]
    got: dict[tuple[int, str], int] = {}
    for server, items in asked.items():
        bodies = _client(clients, cfg, server).get_partitions(
            cfg.supervisor_task_id, [(key, list(subs)) for _, key, subs in items])
        for (n, _, _), body in zip(items, bodies, strict=True):
            table = from_ipc(body)
            tables[n].append(table)
            got[(n, server)] = got.get((n, server), 0) + table.num_rows
    for n, a in enumerate(batch):
        for server, subs, expected in a.sources:
            if got.get((n, server), 0) != expected:
                raise RuntimeError(
                    f"{Interval(a.start, a.end)} partition {a.partition} on {server}: expected "
                    f"{expected} rows from {len(subs)} partials, got {got.get((n, server), 0)}")
    return tables


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


def _stream(clients: dict[str, ShuffleClient], cfg: Phase2Config,
            a: Assignment) -> Iterator[pa.RecordBatch]:
    """The record batches of one partition, read in pages of at most :attr:`page_bytes`
    (paged reads: a partial bigger than a page comes in several), row counts checked per
    daemon as in :func:`_fetch`. The driver sealed each daemon before phase 2, so a
    partition reads as complete exactly when every committed partial has been read."""
    key = PartitionKey(cfg.supervisor_task_id, Interval(a.start, a.end), a.partition)
    for server, subs, expected in a.sources:
        got = 0
        for page in _client(clients, cfg, server).pages(
                key, max_bytes=cfg.page_bytes, sub_task_ids=list(subs), poll=5.0,
                deadline=120.0):
            table = from_ipc(page)
            del page
            got += table.num_rows
            yield from table.to_batches()
        if got != expected:
            raise RuntimeError(f"{Interval(a.start, a.end)} partition {a.partition} on "
                               f"{server}: expected {expected} rows, got {got}")


merge_partition = merge_in_memory  # all partials of one partition -> its segment's rows


def merge_partitions(parts: Sequence[list[pa.Table]], layout: Layout) -> list[pa.Table]:
    """:func:`merge_partition` of each of ``parts``, with one group-by and one sort for
    them all: Acero's per-call cost (~0.3 ms) was most of merging a small partition."""
    if len(parts) == 1:
        return [merge_partition(parts[0], layout)]
    schema = layout.schema()
    flat = [t for tables in parts for t in tables]
    if all(t.schema.equals(flat[0].schema) for t in flat):  # the usual case: cast once
        table = pa.concat_tables(flat).select(schema.names).cast(schema)
    else:
        table = pa.concat_tables([t.select(schema.names).cast(schema) for t in flat])
    rows = [sum(t.num_rows for t in tables) for tables in parts]
    seg = np.repeat(np.arange(len(parts), dtype=np.int32), rows)
    table = combine(table.add_column(0, _SEGMENT, pa.array(seg)), layout, [_SEGMENT])
    table = table.sort_by([(k, "ascending", "at_start") for k in [_SEGMENT, *layout.keys]])
    counts = np.bincount(table.column(_SEGMENT).to_numpy(), minlength=len(parts))
    table = table.drop_columns([_SEGMENT])
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [table.slice(int(starts[n]), int(counts[n])) for n in range(len(parts))]


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


def _write(table: pa.Table, path: str, cfg: Phase2Config) -> int:
    """Write one staged segment, not synced (the task syncs its files together at its end;
    the per-attempt name means a torn file of a failed attempt is never published)."""
    out = _segment_table(table, cfg.multi_value, cfg.layout.hidden)
    # Encoded in memory, then one write: Arrow's file output stream costs ~0.3 ms more per
    # file, which is most of a small segment's write.
    sink = pa.BufferOutputStream()
    pq.write_table(out, sink, compression="zstd", row_group_size=1 << 20)
    data = sink.getvalue()
    with open(path, "wb") as fh:
        fh.write(data)
    return data.size


def _write_streamed(cfg: Phase2Config, clients: dict[str, ShuffleClient], a: Assignment,
                    path: str) -> tuple[int, int, SpillStats]:
    """Merge a partition too big for one piece within the budget, writing its segment as
    the sorted rows come: returns (rows, bytes written, spill stats)."""
    schema = _segment_table(cfg.layout.schema().empty_table(), cfg.multi_value,
                            cfg.layout.hidden).schema
    rows = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        def sink(table: pa.Table) -> None:
            nonlocal rows
            rows += table.num_rows
            writer.write_table(_segment_table(table, cfg.multi_value, cfg.layout.hidden),
                               row_group_size=1 << 20)

        stats = merge_bounded(_stream(clients, cfg, a), cfg.layout, cfg.memory_budget, sink,
                              cfg.spill_dir)
    return rows, os.path.getsize(path), stats


def _prefetched(clients: dict[str, ShuffleClient], cfg: Phase2Config,
                assignments: Iterable[Assignment], pool: ThreadPoolExecutor,
                ) -> Iterator[tuple[list[Assignment], list[list[pa.Table]], float]]:
    """Batches of assignments with their fetched tables and the fetch's seconds, fetched
    one batch ahead on ``pool`` (one thread: it alone uses ``clients``), so that fetching
    overlaps merging and writing (HTTP, IPC reading, Acero and Parquet release the GIL)."""

    def fetch(batch: list[Assignment]) -> tuple[list[Assignment], list[list[pa.Table]], float]:
        started = time.monotonic()
        return batch, _fetch(clients, cfg, batch), time.monotonic() - started

    ahead: deque[Future[tuple[list[Assignment], list[list[pa.Table]], float]]] = deque()
    try:
        for batch in batches(assignments, nbytes=cfg.batch_bytes):
            ahead.append(pool.submit(fetch, batch))
            if len(ahead) > PREFETCH:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()
    finally:
        for f in ahead:
            f.cancel()


def _name(a: Assignment, attempt: int) -> str:
    return f"{a.start}_{a.end}_{a.partition}.a{attempt}.parquet"


def make_phase2(cfg: Phase2Config):  # type: ignore[no-untyped-def]
    """The ``mapPartitions`` function of phase 2 (input: Assignments; output: JSON lines)."""

    def run(assignments: Iterable[Assignment]) -> Iterator[str]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.taskAttemptId() if ctx else 0
        release_free_memory()
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
            return json.dumps({
                "start": a.start, "end": a.end, "partition": a.partition, "rows": rows,
                "rowsIn": a.rows, "bytes": size, "path": path, "bytesFetched": fetched,
                # Where the partition's time went (summed in the task report).
                "fetchMs": fetch_s * 1000, "mergeMs": merge_s * 1000, "writeMs": write_s * 1000,
                "ms": int((fetch_s + merge_s + write_s) * 1000), "attempt": attempt,
                "peakRss": peak, "rssAtStart": baseline, **extra})

        try:
            small = (a for a in todo if not cfg.streams(a))
            for batch, tables, fetch_s in _prefetched(clients, cfg, small, pool):
                merge_started = time.monotonic()
                merged_all = merge_partitions(tables, cfg.layout)
                merge_s = (time.monotonic() - merge_started) / len(batch)
                peak = peak_rss()  # once a batch: /proc reads were 3% of tiny partitions' time
                for a, parts, merged in zip(batch, tables, merged_all, strict=True):
                    write_started = time.monotonic()
                    path = os.path.join(cfg.staging_dir, _name(a, attempt))
                    size = _write(merged, path, cfg)
                    yield result(a, path, merged.num_rows, size, sum(t.nbytes for t in parts),
                                 fetch_s / len(batch), merge_s, time.monotonic() - write_started,
                                 peak)
            for a in large:  # one at a time, streamed: fetch, merge and write interleave
                started = time.monotonic()
                path = os.path.join(cfg.staging_dir, _name(a, attempt))
                rows, size, spilled = _write_streamed(cfg, clients, a, path)
                yield result(a, path, rows, size, a.nbytes, 0.0, time.monotonic() - started,
                             0.0, peak_rss(), spillFiles=spilled.files, spillBytes=spilled.bytes)
            # Durable before the task ends, so before the driver can publish any of them:
            # Spark hands the driver a task's results only once the task has succeeded.
            if written:
                sync_files(written, [cfg.staging_dir])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for c in clients.values():
                c.close()

    return run


def assign(partials: list[dict[str, Any]]) -> list[Assignment]:
    """Group committed partials by (interval, partition), sources per server."""
    by_part: dict[tuple[int, int, int], dict[str, tuple[list[str], int]]] = {}
    sizes: dict[tuple[int, int, int], int] = {}
    for p in partials:
        key = (p["start"], p["end"], p["partition"])
        servers = by_part.setdefault(key, {})
        subs, rows = servers.get(p["server"], ([], 0))
        subs.append(p["sub"])
        servers[p["server"]] = (subs, rows + p["rows"])
        sizes[key] = sizes.get(key, 0) + int(p.get("bytes", 0))
    out = []
    for key, servers in sorted(by_part.items()):
        sources = tuple((srv, tuple(sorted(set(subs))), rows)
                        for srv, (subs, rows) in sorted(servers.items()))
        out.append(Assignment(*key, sources, sizes[key]))
    return out


ROWS_PER_MERGE_TASK = 2_000_000
BYTES_PER_MERGE_TASK = 256 << 20


def merge_tasks(assignments: Sequence[Assignment], shuffled_bytes: int, cores: int) -> int:
    """Phase-2 tasks when ``totalNumMergeTasks`` is unset, from what phase 1 reported.

    One task per :data:`ROWS_PER_MERGE_TASK` rows or :data:`BYTES_PER_MERGE_TASK` shuffled
    bytes (whichever asks for more), at least one per core (``defaultParallelism``) so no
    core idles, at most four per core (a task costs Spark ~0.1 s to schedule and start its
    Python worker, and more tasks than that only spread a skewed partition's neighbours
    thinner), and never more than there are partitions."""
    rows = sum(a.rows for a in assignments)
    wanted = max(-(-rows // ROWS_PER_MERGE_TASK), -(-shuffled_bytes // BYTES_PER_MERGE_TASK))
    cores = max(1, cores)
    return max(1, min(len(assignments), max(cores, min(wanted, 4 * cores))))


def balance(assignments: list[Assignment], tasks: int) -> list[list[Assignment]]:
    """Spread partitions over ``tasks`` merge tasks, largest first onto the lightest task."""
    tasks = max(1, min(tasks, len(assignments)))
    groups: list[list[Assignment]] = [[] for _ in range(tasks)]
    loads = [0] * tasks
    for a in sorted(assignments, key=lambda x: -x.rows):
        i = loads.index(min(loads))
        groups[i].append(a)
        loads[i] += a.rows
    return groups
