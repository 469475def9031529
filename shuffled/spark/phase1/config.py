"""What a phase-1 task is told: :class:`Phase1Config`, one typed object pickled into the
Spark closure (the driver builds it, :mod:`.tasks` reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from shuffled.spark.hooks import NONE, Hooks
from shuffled.spark.rows.rollup import Layout


@dataclass(frozen=True)
class Keying:
    """How a slab's rows are keyed (:mod:`.slabs`): ``kind`` ``hashed`` (Spark's hash of
    ``columns``) or ``range`` (the tuple of ``columns``). ``hashed`` with ``num_shards``
    (the plan known up front): the key is the row's partition, ``pmod(hash, num_shards)``,
    today's hashed shardSpec's function, so that each partition is one key range."""

    kind: str
    columns: tuple[str, ...]
    num_shards: int | None = None
    #: range keys: the share of a chunk's distinct rolled-up rows its sample keeps, by
    #: their hash (1: all, up to the sample's size; below 1 for targetRowsPerSegment,
    #: :func:`shuffled.spark.driver.late.keying`)
    sample_rate: float = 1.0


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
    hooks: Hooks = NONE  # test seams (shuffled.spark.hooks): none in production
    compression: str = "none"  # Arrow IPC buffer compression of partials (tuningConfig)
    max_bytes: int = 256 << 20  # maxBytesInMemory (0: unbounded): bounds rolled-up rows held
    replicas: int = 1  # shuffleReplicas: distinct daemons each flush is written to
    # A recompute (docs/failover.md): the Spark partition each task stands for, by the
    # task's own partition index (None: itself), and per partition the only (chunk start,
    # partitionId) keys to upload (the ones lost); None uploads every key.
    partition_ids: tuple[int, ...] | None = None
    only_keys: dict[int, frozenset[tuple[int, int]]] | None = None
    # String dimensions that may carry multi-values (rows.multivalue's one-string form):
    # the task reports which of them did, so phase 2 stores those as list<string>.
    multi_value: tuple[str, ...] = ()
    # The late plan (issue 36, docs/slab.md): flushes go out as slabs keyed so, their
    # shards chosen after phase 1; None: partials of the partition known up front.
    slabs: Keying | None = None

    @property
    def pending_limit(self) -> int:
        """Bytes of rolled-up rows held before they are compacted (and maybe flushed)."""
        return self.max_bytes // 4 if self.max_bytes else 1 << 62

    @property
    def raw_limit(self) -> int:
        """Bytes of raw rows gathered before they are rolled up (besides maxRowsInMemory):
        a rollup's working set is a few times its input, and on input that does not fold
        its output is a flush, so this bounds both by the budget whatever a row weighs (at
        least 1 MiB: rolling up smaller slices only adds per-call work)."""
        return max(self.max_bytes // 16, 1 << 20) if self.max_bytes else 1 << 62
