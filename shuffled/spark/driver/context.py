"""One ingestion's settings, built once by :func:`~.pipeline.run_ingestion` and passed down.

The driver's steps (partition determination, both phases, publishing) read what they need
from a :class:`JobContext` instead of a dozen parameters each; what executors need is cut
from it into the small picklable configs of :mod:`~shuffled.spark.phase1.tasks` and
:mod:`~shuffled.spark.phase2.merge`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from shuffled.spark.driver.monitor import Monitor, RowCount
from shuffled.spark.driver.report import TaskReport
from shuffled.spark.phase1.columns import metric_column, metric_time_column
from shuffled.spark.hooks import NONE, Hooks
from shuffled.spark.phase1.tasks import Phase1Config
from shuffled.spark.phase2.merge import Phase2Config
from shuffled.spark.rows.rollup import Layout
from shuffled.spark.spec.model import IngestSpec
from shuffled.tokens import Scope, mint

READERS = ("auto", "native", "jvm")
_PHASE1_AGG = {"count": "count", "sum": "sum", "min": "min", "max": "max", "first": "first",
               "last": "last", "hll": "hll", "theta": "theta", "quantiles": "quantiles"}


def layout_of(spec: IngestSpec) -> Layout:
    """The row layout both phases share: dimensions, metrics with their phase-1 aggregation
    and combine function, and whether rollup is on."""
    metrics = []
    for i, m in enumerate(spec.metrics):
        agg = "count" if m.type == "count" else _PHASE1_AGG[m.combine]
        metrics.append((m.name, agg, m.combine, m.value_type,
                        metric_column(i) if m.field else None))
    times = tuple((m.name, metric_time_column(i)) for i, m in enumerate(spec.metrics)
                  if m.first_last)
    sketches = tuple((m.name, m.sketch_size, m.hll_type) for m in spec.metrics if m.sketch_size)
    return Layout(tuple((d.name, d.type) for d in spec.dimensions), tuple(metrics), spec.rollup,
                  times, sketches)


@dataclass(frozen=True)
class Auth:
    """How the driver and executors authenticate to the daemons: ``token`` is the
    driver's (admin of the task, or the shared token), ``write``/``read`` what phase-1 and
    phase-2 executors get (the shared token too, in the shared-token mode)."""

    token: str | None = None
    ca_file: str | None = None
    write: str | None = None
    read: str | None = None

    @classmethod
    def scoped(cls, secret: bytes, task_id: str, ttl: float, ca_file: str | None) -> Auth:
        """Tokens minted for one ingestion (shuffled.tokens): the secret stays here."""
        return cls(mint(secret, task_id, Scope.ADMIN, ttl), ca_file,
                   mint(secret, task_id, Scope.WRITE, ttl), mint(secret, task_id, Scope.READ, ttl))

    @property
    def write_token(self) -> str | None:
        return self.write or self.token

    @property
    def read_token(self) -> str | None:
        return self.read or self.token


@dataclass
class JobContext:
    """Everything one ingestion's driver-side steps share.

    ``phase`` is the label of the step running now (the progress line shows it); it is the
    only field that changes while the job runs, besides what accumulates in ``report``.
    """

    spark: SparkSession
    spec: IngestSpec
    files: list[str]
    servers: tuple[str, ...]
    task_id: str
    report: TaskReport
    staging: str
    segments: str  # the directory phase 2 writes this ingestion's segments to (final place)
    auth: Auth = Auth()
    reader: str = "auto"
    say: Callable[[str], None] = lambda _msg: None
    hooks: Hooks = NONE  # test seams (shuffled.spark.hooks): none in production
    phase: str = "starting"
    monitor: Monitor | None = None  # heartbeats: which daemons are gone
    rows: RowCount | None = None  # rows handled so far, for the progress line
    lost: dict[str, str] = field(default_factory=dict)  # daemons found gone, with why
    layout: Layout = field(init=False)

    def __post_init__(self) -> None:
        if self.reader not in READERS:
            raise ValueError(f"reader must be auto, native or jvm, not {self.reader!r}")
        self.layout = layout_of(self.spec)

    @property
    def job_group(self) -> str:
        """The Spark job group of this ingestion's current phase: the progress line counts
        the tasks of its jobs, those already finished too (:func:`.monitor.stage_status`)."""
        return f"shuffled-{self.task_id}-{self.phase}"

    def enter(self, phase: str) -> None:
        """Start ``phase``: the progress line's label, and the job group its Spark jobs
        run in (set on this, the driver's, thread)."""
        self.phase = phase
        self.spark.sparkContext.setJobGroup(self.job_group, phase)

    def settle(self) -> None:
        """The phase's work is done: make sure its progress was shown at least once (a phase
        quicker than the monitor's tick would otherwise show no bar before its summary)."""
        if self.monitor is not None:
            self.monitor.settle()

    @property
    def survivors(self) -> tuple[str, ...]:
        """The daemons not found gone, in the job's order."""
        return tuple(s for s in self.servers if s not in self.lost)

    def phase1_config(self, multi_value: tuple[str, ...] = (), **recompute: Any) -> Phase1Config:
        """What a phase-1 Spark task needs (pickled into its closure): over the surviving
        daemons; ``multi_value``: the string dimensions that may carry multi-values;
        ``recompute`` sets :class:`Phase1Config`'s recompute fields."""
        s = self.spec
        return Phase1Config(self.task_id, self.survivors, self.layout, s.segment_granularity,
                            s.max_rows_in_memory, s.max_saved_parse_exceptions,
                            self.auth.write_token, self.auth.ca_file, self.hooks,
                            s.partial_compression, s.max_bytes_in_memory,
                            s.shuffle_replicas, multi_value=multi_value,
                            **recompute)

    def phase2_config(self, multi_value: tuple[str, ...] = (),
                      tier: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Phase2Config:
        """What a phase-2 Spark task needs (pickled into its closure); ``multi_value``: the
        string dimensions phase 1 saw holding multi-values (stored as list<string>)."""
        return Phase2Config(self.task_id, self.layout, self.segments, self.auth.read_token,
                            self.auth.ca_file, self.spec.max_bytes_in_memory,
                            retry_seconds=float(self.spec.shuffle_retry_seconds),
                            lost=frozenset(self.lost), servers=self.servers,
                            tier=tier, hooks=self.hooks,
                            multi_value=multi_value, dimension_codec=self.spec.dimension_codec,
                            metric_codec=self.spec.metric_codec)
