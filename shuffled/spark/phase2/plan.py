"""Phase 2's plan, made on the driver and pickled to the merge tasks: the task settings
(:class:`Phase2Config`), one :class:`Assignment` per output partition (where its committed
partials are: on which replicas, of which subtasks, how many rows), how many merge tasks,
and which partitions each gets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shuffled.client import RetryPolicy
from shuffled.spark.hooks import NONE, Hooks
from shuffled.spark.records import Partial
from shuffled.spark.phase2.spill import WORK_FACTOR

if TYPE_CHECKING:  # the annotation only; rows is below phase2
    from shuffled.spark.rows.rollup import Layout


@dataclass(frozen=True)
class Phase2Config:
    """Everything a merge task needs; pickled into the Spark closure. ``memory_budget`` is
    the spec's maxBytesInMemory (0: unbounded); ``spill_dir`` where a partition bigger
    than it spills (None: the system's temporary directory)."""

    supervisor_task_id: str
    layout: Layout
    segment_dir: str  # where segments are written: their final place (phase2.publish)
    token: str | None = None
    ca_file: str | None = None
    memory_budget: int = 0
    spill_dir: str | None = None
    # How long a read waits for a daemon that does not answer (tuningConfig
    # shuffleRetrySeconds): long enough to ride through a daemon's restart, after which
    # the partition is reported lost instead of failing the task (docs/failover.md).
    retry_seconds: float = 30.0
    lost: frozenset[str] = frozenset()  # daemons the driver knows are gone: never asked
    # Every daemon of the task: the survivors a merge task asks for the driver's verdict
    # when its reads from one fail (phase2.verdict).
    servers: tuple[str, ...] = ()
    # Deep storage: per daemon whose task copy is complete in the tier, the survivors'
    # routes to its share (``<survivor>/peers/<instance>``), read when it is gone.
    tier: tuple[tuple[str, tuple[str, ...]], ...] = ()
    hooks: Hooks = NONE  # test seams (shuffled.spark.hooks): none in production
    multi_value: tuple[str, ...] = ()  # dimensions written as list<string> (rows.multivalue)
    dimension_codec: str = "lz4"  # Parquet codecs of the segments (tuningConfig.indexSpec)
    metric_codec: str = "lz4"

    def replicas(self, held: Sequence[str]) -> tuple[str, ...]:
        """Where a source held on ``held`` may be read, in order: its daemons, then for
        each whose share is complete in deep storage the survivors' routes to that share
        (read only once the daemons are gone: no recompute, docs/deep-storage.md)."""
        if not self.tier:
            return tuple(held)
        routes = dict(self.tier)
        extra = [u for server in held for u in routes.get(server, ())]
        return tuple(held) + tuple(u for u in dict.fromkeys(extra) if u not in held)

    def codecs(self, columns: Sequence[str]) -> dict[str, str]:
        """The Parquet codec of each segment column: the metric codec for the metrics and
        ``__time`` (a long column, as in Druid), the dimension codec for the rest."""
        metrics = {m[0] for m in self.layout.metrics} | {"__time"}
        return {c: self.metric_codec if c in metrics else self.dimension_codec for c in columns}

    @property
    def retry(self) -> RetryPolicy:
        """The read retry policy: a refused connection is tried again for ``retry_seconds``."""
        return RetryPolicy(attempts=max(2, int(self.retry_seconds) * 2), backoff=0.2,
                           max_backoff=2.0, deadline=self.retry_seconds)

    def retry_of(self, server: str) -> RetryPolicy:
        """The read retry policy for ``server``: :attr:`retry`, but a daemon whose share is
        in deep storage is given up after a second (its share is read from the tier through
        a survivor, as exact as from it: waiting out its restart would only be slower)."""
        if self.tier and server in dict(self.tier):
            return RetryPolicy(attempts=3, backoff=0.1, max_backoff=0.3, deadline=1.0)
        return self.retry

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
    # (the daemons holding them: replicas, sub ids, rows there)
    sources: tuple[tuple[tuple[str, ...], tuple[str, ...], int], ...]
    nbytes: int = 0  # bytes of its partials as phase 1 shipped them

    @property
    def rows(self) -> int:
        return sum(s[2] for s in self.sources)



def assign(partials: list[Partial]) -> list[Assignment]:
    """Group committed partials by (interval, partition), sources per replica set (the
    daemons holding a flush)."""
    Sources = dict[tuple[str, ...], tuple[list[str], int]]
    by_part: dict[tuple[int, int, int], Sources] = {}
    sizes: dict[tuple[int, int, int], int] = {}
    for p in partials:
        key = p.key
        sources = by_part.setdefault(key, {})
        replicas = p.replicas or (p.server,)
        subs, rows = sources.get(replicas, ([], 0))
        subs.append(p.sub)
        sources[replicas] = (subs, rows + p.rows)
        sizes[key] = sizes.get(key, 0) + p.bytes
    out = []
    for key, sources in sorted(by_part.items()):
        merged = tuple((srv, tuple(sorted(set(subs))), rows)
                       for srv, (subs, rows) in sorted(sources.items()))
        out.append(Assignment(*key, merged, sizes[key]))
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
