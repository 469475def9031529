"""The task report (Druid-like ``ingestionStatsAndErrors`` plus the seed's per-task metrics)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shuffled.spark.records import TaskStats


def counted(n: int, noun: str) -> str:
    """``1 partition``, ``2,048 partitions``: a count with its noun in the right number
    (every count the driver prints has thousands separators)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def size(n: int) -> str:
    """Bytes as the driver prints them everywhere: ``908 bytes`` below 10 kB (where a
    tenth of a MB would say nothing), else ``0.5 MB``, ``26.1 MB``."""
    return f"{n:,} bytes" if n < 10_000 else f"{n / 1e6:,.1f} MB"


@dataclass
class TaskReport:
    """Accumulates what a job did; :meth:`to_json` is what lands in ``task-report.json``."""

    task_id: str
    data_source: str
    version: str
    servers: list[str]
    started: float = field(default_factory=time.time)
    status: str = "RUNNING"
    error: str | None = None
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=lambda: {
        "processed": 0, "processedBytes": 0, "processedWithError": 0, "unparseable": 0,
        "thrownAway": 0})
    bytes_shuffled: int = 0
    bytes_before_compression: int = 0
    rows_shipped: int = 0
    peak_rss: int = 0  # the largest phase-1 Python worker's peak RSS (VmHWM)
    peak_rss_growth: int = 0  # the most one phase-1 task added to its worker
    bytes_replicated: int = 0  # shuffleReplicas: bytes written beyond the first copy
    replication_ms: int = 0  # summed over the tasks
    failovers: int = 0  # flushes moved past an unusable daemon
    bytes_fetched: int = 0
    rows_out: int = 0
    subtasks: list[dict[str, Any]] = field(default_factory=list)
    unparseable_events: list[dict[str, Any]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    cleanup: dict[str, str] = field(default_factory=dict)
    recovery: dict[str, Any] | None = None  # lost daemons and what was redone (failover)

    def phase(self, name: str, started: float, **facts: Any) -> None:
        self.phases[name] = {"ingest/task/time": int((time.monotonic() - started) * 1000), **facts}

    def add_subtask(self, stats: TaskStats) -> None:
        self.subtasks.append({
            "id": f"p{stats.partition}-a{stats.attempt}",
            "sparkPartition": stats.partition, "attemptNumber": stats.attempt_number,
            "server": stats.server, "ingest/task/time": stats.ms,
            "ingest/task/bytes/processed": stats.bytes_processed,
            "rows": stats.rows_in, "bytesShuffled": stats.bytes_shuffled,
        })
        self.rows["processed"] += stats.processed
        self.rows["processedWithError"] += stats.processed_with_error
        self.rows["processedBytes"] += stats.bytes_processed
        self.rows["unparseable"] += stats.unparseable
        self.rows["thrownAway"] += stats.thrown_away
        self.bytes_shuffled += stats.bytes_shuffled
        self.bytes_before_compression += stats.bytes_before_compression
        self.rows_shipped += stats.rows_shipped
        self.bytes_replicated += stats.bytes_replicated
        self.replication_ms += stats.replication_ms
        self.failovers += stats.failovers
        self.peak_rss = max(self.peak_rss, stats.peak_rss)
        self.peak_rss_growth = max(self.peak_rss_growth, stats.peak_rss - stats.rss_at_start)

    def to_json(self) -> dict[str, Any]:
        elapsed = int((time.time() - self.started) * 1000)
        return {
            "type": "index_parallel",
            "id": self.task_id,
            "dataSource": self.data_source,
            "status": self.status,
            "errorMsg": self.error,
            "version": self.version,
            "shuffleServers": self.servers,
            "ingest/task/time": elapsed,
            "ingest/task/bytes/processed": self.rows["processedBytes"],
            "bytesShuffled": self.bytes_shuffled,
            "bytesShuffledBeforeCompression": self.bytes_before_compression,
            "bytesFetched": self.bytes_fetched,
            "rowsOut": self.rows_out,
            "ingestionStatsAndErrors": {
                "rowStats": {"buildSegments": dict(self.rows)},
                "unparseableEvents": self.unparseable_events,
            },
            "phases": self.phases,
            "subtasks": self.subtasks,
            "segments": len(self.segments),
            "cleanup": self.cleanup,
            "recovery": self.recovery,
        }

    def summary(self) -> str:
        """A few console lines."""
        r = self.rows
        lines = [
            f"{self.status}: {self.task_id} ({self.data_source}, version {self.version})",
            f"  rows: {r['processed']:,} processed, {r['processedWithError']:,} with errors, "
            f"{r['unparseable']:,} unparseable, "
            f"{r['thrownAway']:,} thrown away -> {counted(self.rows_out, 'row')} in "
            f"{counted(len(self.segments), 'segment')}",
            f"  bytes: {size(r['processedBytes'])} processed, {size(self.bytes_shuffled)} "
            "shuffled",
        ]
        times = ", ".join(f"{k} {v['ingest/task/time'] / 1000:.2f}s" for k, v in self.phases.items())
        if times:
            lines.append(f"  time: {times}")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)
