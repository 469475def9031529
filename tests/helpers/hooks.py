"""The tests' hooks into an ingestion (subclasses of :class:`shuffled.spark.hooks.Hooks`):
fail chosen phase-1 attempts after some uploads, kill or signal daemons the test started (by
pid) at a chosen point. Registered to pickle by value, so Spark's executors (on a cluster,
in another working directory) get them without importing the tests."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark import cloudpickle

from shuffled.spark.hooks import Hooks

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass
class FailAttempts(Hooks):
    """Phase-1 attempts ``attempts`` of Spark partitions ``partitions`` raise once they
    have ``after_uploads`` partials answered (what a retry must ignore is left behind)."""

    partitions: Sequence[int]
    attempts: Sequence[int] = (0,)
    after_uploads: int = 1

    def phase1_uploaded(self, partition: int, attempt_number: int, uploads: int) -> None:
        if (partition in self.partitions and attempt_number in self.attempts
                and uploads >= self.after_uploads):
            raise RuntimeError(f"injected phase-1 failure (partition {partition}, attempt "
                               f"{attempt_number}, after {uploads} uploads)")


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # gone already (an earlier upload or attempt stopped it)


@dataclass
class StopDaemons(Hooks):
    """Signal daemons the test started, by pid: in phase 1 once Spark partition
    ``in_phase1`` has ``after_uploads`` partials answered, between the phases, or in phase 2
    once a merge task has fetched a batch."""

    in_phase1: Sequence[int] = ()
    between: Sequence[int] = ()
    in_phase2: Sequence[int] = ()
    sealed: Sequence[int] = ()  # after the seal, before phase 2
    sig: int = int(signal.SIGKILL)
    phase2_sig: int = int(signal.SIGTERM)
    partition: int = 0
    after_uploads: int = 2
    fired: list[str] = field(default_factory=list)

    def phase1_uploaded(self, partition: int, attempt_number: int, uploads: int) -> None:
        if self.in_phase1 and partition == self.partition and uploads >= self.after_uploads:
            _signal(self.in_phase1, self.sig)

    def between_phases(self) -> None:
        _signal(self.between, self.sig)

    def after_seal(self) -> None:
        _signal(self.sealed, self.sig)

    def phase2_fetched(self, batches: int) -> None:
        _signal(self.in_phase2, self.phase2_sig)


@dataclass
class BlockPhase1(Hooks):
    """Every phase-1 task blocks after its first upload, on an event nothing sets (for at
    most ``seconds``, a bound the stall watchdog must beat by far)."""

    seconds: float = 60.0

    def phase1_uploaded(self, partition: int, attempt_number: int, uploads: int) -> None:
        import threading

        threading.Event().wait(self.seconds)


@dataclass
class DriverCollects(Hooks):
    """Between the phases the driver collects ``tasks`` task results of ``mb`` MB each:
    more than a small driver heap holds (the way a sample pulled to the driver ran it out
    of heap in issue 36)."""

    tasks: int = 12
    mb: int = 64

    def between_phases(self) -> None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        assert spark is not None
        size = self.mb << 20
        spark.sparkContext.parallelize(range(self.tasks), self.tasks) \
            .map(lambda i: b"x" * size).collect()


@dataclass
class SeeFrozen(Hooks):
    """Records, between the phases (on the driver), how many objects the collector holds
    frozen (:mod:`shuffled.spark.driver.gcpause`)."""

    seen: list[int] = field(default_factory=list)

    def between_phases(self) -> None:
        import gc

        self.seen.append(gc.get_freeze_count())


@dataclass
class ReleaseAtTaskStart(Hooks):
    """Each task hands back what its worker's allocators kept from earlier tasks before it
    reads its baseline, so that its reported RSS growth is its own use from an emptied pool
    (production keeps those pages: shuffled.spark.phase1.tasks.run_task), and records that
    it did in ``record``, a file (one line a task start)."""

    record: str | None = None

    def task_started(self) -> None:
        from shuffled.spark.rows.memory import release_free_memory

        release_free_memory()
        if self.record is not None:
            with open(self.record, "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()}\n")
