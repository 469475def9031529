"""Phase 1 on the executors: roll up locally, PUT each (interval, partition) partial segment.

Each Spark task is one subtask. Its id is ``p<sparkPartition>-a<taskAttemptId>-f<flush>``:
``taskAttemptId`` is unique per attempt (retries and speculative copies included), so two
attempts never overwrite each other. The task RETURNS the list of partials it uploaded as
its result rows; Spark keeps the result of exactly one successful attempt per partition,
so the driver's collected list names exactly the committed attempts (docs/exactly-once.md).

Memory per task is bounded: rolled-up rows are buffered up to ``max_rows`` rows, then
compacted, and flushed as additional partial segments (new flush number) if still large.
This module runs on executors: it imports only shuffled.client/protocol, pyarrow and pyspark's
TaskContext.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey
from shuffled.spark.granularity import bucket_end
from shuffled.spark.rollup import BAD, BUCKET, CHUNK, Layout, combine, rollup_input, split_by, to_ipc

RESULT_SCHEMA = "json string"


@dataclass(frozen=True)
class Phase1Config:
    """Everything a phase-1 task needs; pickled into the Spark closure."""

    supervisor_task_id: str
    servers: tuple[str, ...]
    layout: Layout
    segment_granularity: str
    max_rows: int
    max_saved_bad: int
    token: str | None = None
    ca_file: str | None = None
    fault: dict[str, Any] = field(default_factory=dict)  # tests only: see _maybe_fail


class _Task:
    def __init__(self, cfg: Phase1Config) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        self.partition = ctx.partitionId() if ctx else 0
        self.attempt = ctx.taskAttemptId() if ctx else 0
        self.attempt_number = ctx.attemptNumber() if ctx else 0
        self.cfg = cfg
        self.server = cfg.servers[self.partition % len(cfg.servers)]
        self.client = ShuffleClient(self.server, token=cfg.token, ca_file=cfg.ca_file)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.flushes = 0
        self.uploads: list[dict[str, Any]] = []
        self.stats = {"rowsIn": 0, "processed": 0, "unparseable": 0, "thrownAway": 0,
                      "bytesProcessed": 0, "bytesShuffled": 0}
        self.bad: list[dict[str, Any]] = []

    def add(self, batch: pa.RecordBatch) -> None:
        self.stats["rowsIn"] += batch.num_rows
        self.stats["bytesProcessed"] += batch.nbytes
        table = pa.Table.from_batches([batch])
        flags = table.column(BAD)
        if flags.null_count != len(flags):
            self._count_bad(pc.drop_null(flags).to_pylist())
            table = table.filter(pc.is_null(flags))
        table = table.drop_columns([BAD])
        self.stats["processed"] += table.num_rows
        if table.num_rows == 0:
            return
        rolled = rollup_input(table, self.cfg.layout, [CHUNK, BUCKET])
        self.pending.append(rolled)
        self.pending_rows += rolled.num_rows
        if self.pending_rows > self.cfg.max_rows:
            merged = combine(pa.concat_tables(self.pending), self.cfg.layout, [CHUNK, BUCKET])
            self.pending, self.pending_rows = [merged], merged.num_rows
            if merged.num_rows > self.cfg.max_rows // 2:
                self.flush()

    def _count_bad(self, values: list[str]) -> None:
        for v in values:
            if v == "T":
                self.stats["thrownAway"] += 1
                continue
            self.stats["unparseable"] += 1
            if len(self.bad) < self.cfg.max_saved_bad:
                _, file, line, reason, raw = (v.split("\t", 4) + ["", "", "", ""])[:5]
                self.bad.append({"file": file, "line": int(line) if line else None,
                                 "message": reason, "raw": raw})

    def flush(self) -> None:
        if not self.pending:
            return
        table = combine(pa.concat_tables(self.pending), self.cfg.layout, [CHUNK, BUCKET])
        self.pending, self.pending_rows = [], 0
        sub = f"p{self.partition}-a{self.attempt}-f{self.flushes}"
        self.flushes += 1
        for (chunk, bucket), part in split_by(table, [CHUNK, BUCKET]):
            interval = Interval(chunk, bucket_end(chunk, self.cfg.segment_granularity))
            key = PartialKey(self.cfg.supervisor_task_id, sub, interval, bucket)
            body = to_ipc(part)
            answer = self.client.put_partial(key, body)
            self.stats["bytesShuffled"] += len(body)
            self.uploads.append({"kind": "partial", "server": self.server, "sub": sub,
                                 "start": chunk, "end": interval.end, "partition": bucket,
                                 "rows": part.num_rows, "bytes": len(body),
                                 "crc32c": answer.get("crc32c")})
            _maybe_fail(self.cfg.fault, self.partition, self.attempt_number, len(self.uploads))


def _maybe_fail(fault: dict[str, Any], partition: int, attempt_number: int, uploads: int) -> None:
    """Fault injection for tests: fail chosen attempts after some uploads."""
    if not fault:
        return
    if (partition in fault.get("partitions", ()) and attempt_number in fault.get("attempts", (0,))
            and uploads >= fault.get("after_uploads", 1)):
        raise RuntimeError(f"injected phase-1 failure (partition {partition}, "
                           f"attempt {attempt_number}, after {uploads} uploads)")


def make_phase1(cfg: Phase1Config):  # type: ignore[no-untyped-def]
    """The ``mapInArrow`` function of phase 1."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        started = time.monotonic()
        task = _Task(cfg)
        try:
            for batch in batches:
                task.add(batch)
            task.flush()
        finally:
            task.client.close()
        stats = {"kind": "stats", "partition": task.partition, "attempt": task.attempt,
                 "attemptNumber": task.attempt_number, "server": task.server,
                 "ms": int((time.monotonic() - started) * 1000), "bad": task.bad, **task.stats}
        lines = [json.dumps(u) for u in task.uploads] + [json.dumps(stats)]
        yield pa.RecordBatch.from_pydict({"json": lines})

    return run
