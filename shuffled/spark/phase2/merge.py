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
from shuffled.spark.rows.rollup import TIME, Layout, combine, from_ipc, sort_segment

_IDS_PER_REQUEST = 64
_SEGMENT = "__segment"  # which partition of a batch a row belongs to, while merging
PREFETCH = 1  # batches fetched ahead of the one being merged
BATCH_PARTITIONS = 128  # partitions per batch (one bulk read per daemon)
BATCH_ROWS = 500_000  # about this many rows per batch (bounds a merge task's memory)


@dataclass(frozen=True)
class Phase2Config:
    supervisor_task_id: str
    layout: Layout
    staging_dir: str
    token: str | None = None
    ca_file: str | None = None


@dataclass(frozen=True)
class Assignment:
    """One output partition: where its committed partials are and how many rows they hold."""

    start: int
    end: int
    partition: int
    sources: tuple[tuple[str, tuple[str, ...], int], ...]  # (server, sub ids, rows there)

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
            rows: int = BATCH_ROWS) -> Iterator[list[Assignment]]:
    """Consecutive assignments in batches of at most ``partitions`` and about ``rows``."""
    batch: list[Assignment] = []
    held = 0
    for a in assignments:
        if batch and (len(batch) >= partitions or held + a.rows > rows):
            yield batch
            batch, held = [], 0
        batch.append(a)
        held += a.rows
    if batch:
        yield batch


def merge_partition(tables: list[pa.Table], layout: Layout) -> pa.Table:
    """All partials of one partition -> the final, sorted, perfectly rolled-up rows."""
    schema = layout.schema()
    table = pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])
    return sort_segment(combine(table, layout), layout)


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


def _write(table: pa.Table, path: str) -> int:
    """Write one staged segment, not synced (the task syncs its files together at its end;
    the per-attempt name means a torn file of a failed attempt is never published)."""
    ts = table.column(TIME).cast(pa.timestamp("ms", tz="UTC"))
    out = table.set_column(0, pa.field(TIME, pa.timestamp("ms", tz="UTC"), nullable=False), ts)
    # Encoded in memory, then one write: Arrow's file output stream costs ~0.3 ms more per
    # file, which is most of a small segment's write.
    sink = pa.BufferOutputStream()
    pq.write_table(out, sink, compression="zstd", row_group_size=1 << 20)
    data = sink.getvalue()
    with open(path, "wb") as fh:
        fh.write(data)
    return data.size


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
        for batch in batches(assignments):
            ahead.append(pool.submit(fetch, batch))
            if len(ahead) > PREFETCH:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()
    finally:
        for f in ahead:
            f.cancel()


def make_phase2(cfg: Phase2Config):  # type: ignore[no-untyped-def]
    """The ``mapPartitions`` function of phase 2 (input: Assignments; output: JSON lines)."""

    def run(assignments: Iterable[Assignment]) -> Iterator[str]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.taskAttemptId() if ctx else 0
        clients: dict[str, ShuffleClient] = {}
        written: list[str] = []
        pool = ThreadPoolExecutor(1, thread_name_prefix="phase2-fetch")
        try:
            for batch, tables, fetch_s in _prefetched(clients, cfg, assignments, pool):
                merge_started = time.monotonic()
                merged_all = merge_partitions(tables, cfg.layout)
                merge_s = (time.monotonic() - merge_started) / len(batch)
                for a, parts, merged in zip(batch, tables, merged_all, strict=True):
                    write_started = time.monotonic()
                    name = f"{a.start}_{a.end}_{a.partition}.a{attempt}.parquet"
                    path = os.path.join(cfg.staging_dir, name)
                    size = _write(merged, path)
                    written.append(path)
                    write_s = time.monotonic() - write_started
                    result: dict[str, Any] = {
                        "start": a.start, "end": a.end, "partition": a.partition,
                        "rows": merged.num_rows, "rowsIn": a.rows, "bytes": size, "path": path,
                        "bytesFetched": sum(t.nbytes for t in parts),
                        # Where the partition's time went (its share of its batch's fetch
                        # and merge; summed in the task report).
                        "fetchMs": fetch_s / len(batch) * 1000, "mergeMs": merge_s * 1000,
                        "writeMs": write_s * 1000,
                        "ms": int((fetch_s / len(batch) + merge_s + write_s) * 1000),
                        "attempt": attempt,
                    }
                    yield json.dumps(result)
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
    for p in partials:
        servers = by_part.setdefault((p["start"], p["end"], p["partition"]), {})
        subs, rows = servers.get(p["server"], ([], 0))
        subs.append(p["sub"])
        servers[p["server"]] = (subs, rows + p["rows"])
    out = []
    for (start, end, part), servers in sorted(by_part.items()):
        sources = tuple((srv, tuple(sorted(set(subs))), rows)
                        for srv, (subs, rows) in sorted(servers.items()))
        out.append(Assignment(start, end, part, sources))
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
