"""Phase 2 on the executors: fetch each assigned partition's committed partials, merge, write.

Each merge task gets whole partitions. For every daemon holding part of a partition it asks
for exactly the committed subtasks' partials (aggregate GET with ``subTaskId`` filters, the
client retries with backoff) and checks the row count against what phase 1 reported. The
rows are merged with the combining aggregators, sorted by time then dimensions and written
as one Parquet file under a per-attempt staging name; the driver publishes the file named by
the attempt whose result it received. Runs on executors: shuffled.client/protocol + pyarrow.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartitionKey
from shuffled.spark.rollup import TIME, Layout, combine, from_ipc, sort_segment

_IDS_PER_REQUEST = 64


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


def _fetch(clients: dict[str, ShuffleClient], cfg: Phase2Config, a: Assignment) -> list[pa.Table]:
    key = PartitionKey(cfg.supervisor_task_id, Interval(a.start, a.end), a.partition)
    tables = []
    for server, subs, expected in a.sources:
        client = clients.get(server)
        if client is None:
            client = clients[server] = ShuffleClient(server, token=cfg.token, ca_file=cfg.ca_file)
        got = 0
        for i in range(0, len(subs), _IDS_PER_REQUEST):
            table = from_ipc(client.get_partition(key, list(subs[i:i + _IDS_PER_REQUEST])))
            got += table.num_rows
            tables.append(table)
        if got != expected:
            raise RuntimeError(f"{key.interval} partition {a.partition} on {server}: "
                               f"expected {expected} rows from {len(subs)} partials, got {got}")
    return tables


def merge_partition(tables: list[pa.Table], layout: Layout) -> pa.Table:
    """All partials of one partition -> the final, sorted, perfectly rolled-up rows."""
    schema = layout.schema()
    table = pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])
    return sort_segment(combine(table, layout), layout)


def _write(table: pa.Table, path: str) -> int:
    ts = table.column(TIME).cast(pa.timestamp("ms", tz="UTC"))
    out = table.set_column(0, pa.field(TIME, pa.timestamp("ms", tz="UTC"), nullable=False), ts)
    tmp = path + ".tmp"
    pq.write_table(out, tmp, compression="zstd", row_group_size=1 << 20)
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return os.path.getsize(path)


def make_phase2(cfg: Phase2Config):  # type: ignore[no-untyped-def]
    """The ``mapPartitions`` function of phase 2 (input: Assignments; output: JSON lines)."""

    def run(assignments: Iterable[Assignment]) -> Iterator[str]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.taskAttemptId() if ctx else 0
        clients: dict[str, ShuffleClient] = {}
        try:
            for a in assignments:
                started = time.monotonic()
                tables = _fetch(clients, cfg, a)
                fetched = sum(t.nbytes for t in tables)
                merged = merge_partition(tables, cfg.layout)
                name = f"{a.start}_{a.end}_{a.partition}.a{attempt}.parquet"
                path = os.path.join(cfg.staging_dir, name)
                size = _write(merged, path)
                result: dict[str, Any] = {
                    "start": a.start, "end": a.end, "partition": a.partition,
                    "rows": merged.num_rows, "rowsIn": a.rows, "bytes": size, "path": path,
                    "bytesFetched": fetched, "ms": int((time.monotonic() - started) * 1000),
                    "attempt": attempt,
                }
                yield json.dumps(result)
        finally:
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
