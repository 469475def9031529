"""The watchdog: no Spark job of an ingestion sits without progress for longer than the
stall timeout (``--stall-timeout``, :data:`DEFAULT_STALL_SECONDS`).

A thread asks Spark's status tracker, every second (a quarter of the timeout if less),
what the jobs of the ingestion's current job group (:attr:`.context.JobContext.job_group`)
have done: tasks finished, failed and started per stage, the records and bytes their
stages have read and written so far (Spark's live task metrics, sent with each executor
heartbeat), and, from the caller, figures of its own (what the daemons hold and served,
rows counted). While a job runs and none of that changes for ``stall_seconds``, the
watchdog writes down what stalled (the phase, the stage, its tasks, the driver's heap) and
cancels the group's jobs: the driver's blocked Spark call then fails, and the ingestion
fails with what :attr:`Watchdog.fired` says instead of that call's error. Should the call
not come back after the cancel (a JVM too short of heap to act on it), every job is
cancelled, and then ``on_wedged`` runs (the pipeline kills a JVM it started).

This is what catches a result that never reaches the driver: Spark's ``task-result-getter``
thread dies of an ``OutOfMemoryError`` without failing its task, which then sits in GET
RESULT forever (issue 36). A JVM that exits instead (``-XX:+ExitOnOutOfMemoryError``, see
:mod:`.sparksession`) is explained by :mod:`.sparkfailure`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("shuffled.spark")

DEFAULT_STALL_SECONDS = 300.0


@dataclass(frozen=True)
class StageState:
    """One active stage of a watched job, as the status tracker saw it."""

    stage: int
    name: str
    tasks: int
    done: int
    running: int
    failed: int


class Watchdog:
    """Polls the Spark jobs of ``group()`` and fires once they stall (module docstring)."""

    def __init__(self, spark: Any, group: Callable[[], str], phase: Callable[[], str],
                 stall_seconds: float = DEFAULT_STALL_SECONDS, *,
                 figures: Callable[[], Hashable] | None = None,
                 on_wedged: Callable[[], None] | None = None,
                 poll_seconds: float = 1.0, grace_seconds: float | None = None) -> None:
        if stall_seconds <= 0:
            raise ValueError(f"the stall timeout must be above 0 seconds, not {stall_seconds}")
        self.spark = spark
        self.group, self.phase = group, phase
        self.stall_seconds = stall_seconds
        self.figures = figures
        self.on_wedged = on_wedged
        self.poll_seconds = min(poll_seconds, stall_seconds / 4)
        # how long a cancel gets to stop the stalled jobs before the next, harder, step
        self.grace_seconds = (min(30.0, max(5.0, stall_seconds)) if grace_seconds is None
                              else grace_seconds)
        # what stalled and what to try, once it did (the ingestion's failure)
        self.fired: tuple[str, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="shuffled-watchdog")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    # --- the thread ---------------------------------------------------------------------

    def _watch(self) -> None:
        last: Hashable = None
        since = time.monotonic()
        while not self._stop.wait(self.poll_seconds):
            try:
                group = self.group()
                seen = self._state(group)
            except Exception as exc:  # a JVM that is gone: the driver's own call fails too
                log.debug("the watchdog cannot read Spark's status: %s", exc)
                continue
            now = time.monotonic()
            if seen is None or seen != last:  # no job running, or progress
                last, since = seen, now
                continue
            if now - since >= self.stall_seconds:
                self._fire(group, now - since)
                return

    def _state(self, group: str) -> Hashable:
        """What the group's running jobs have done so far (None: no job runs)."""
        sc = self.spark.sparkContext
        tracker = sc.statusTracker()
        stages: set[int] = set()
        for jid in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(jid)
            if job is not None and job.status == "RUNNING":
                stages.update(job.stageIds)
        if not stages:
            return None
        counts = []
        for sid in sorted(stages):
            info = tracker.getStageInfo(sid)
            if info is not None:
                counts.append((sid, info.currentAttemptId, info.numCompletedTasks,
                               info.numActiveTasks, info.numFailedTasks))
        return (tuple(counts), _stage_metrics(sc, stages),
                self.figures() if self.figures is not None else None)

    def stalled_stages(self, group: str) -> list[StageState]:
        tracker = self.spark.sparkContext.statusTracker()
        out = []
        for jid in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(jid)
            if job is None or job.status != "RUNNING":
                continue
            for sid in job.stageIds:
                info = tracker.getStageInfo(sid)
                if info is not None and info.numCompletedTasks < info.numTasks:
                    out.append(StageState(sid, info.name, info.numTasks,
                                          info.numCompletedTasks, info.numActiveTasks,
                                          info.numFailedTasks))
        return sorted(out, key=lambda s: s.stage)

    def _fire(self, group: str, silent: float) -> None:
        phase = self.phase()
        try:
            stages = self.stalled_stages(group)
        except Exception:
            stages = []
        what = "; ".join(
            f"stage {s.stage} ({s.name}) had {s.done} of {s.tasks} tasks done, "
            f"{s.running} running" + (f", {s.failed} failed" if s.failed else "")
            for s in stages) or "its Spark job showed no stage"
        heap = driver_heap(self.spark)
        self.fired = (
            f"{phase} made no progress for {silent:.0f} s (the stall timeout): {what}; no "
            f"task finished and no input was read or written meanwhile{heap}; its Spark jobs "
            "were cancelled",
            "a task waiting on something that never comes (an input server, a lock) or a "
            "result that never reached the driver (its JVM short of heap) stalls like this: "
            "raise spark.driver.memory (e.g. --conf spark.driver.memory=4g) if the heap is "
            "nearly full, look at what the tasks wait on with --verbose, or raise "
            "--stall-timeout if the work is only slow")
        log.warning("%s", self.fired[0])
        self._cancel(group)

    def _cancel(self, group: str) -> None:
        sc = self.spark.sparkContext
        grace = self.grace_seconds
        for step in ("group", "all", "wedged"):
            try:
                if step == "group":
                    sc.cancelJobGroup(group)
                elif step == "all":
                    log.warning("the stalled jobs did not stop when cancelled; cancelling "
                              "every job")
                    sc.cancelAllJobs()
                elif self.on_wedged is not None:
                    log.warning("the stalled jobs did not stop when cancelled; stopping Spark")
                    self.on_wedged()
            except Exception as exc:
                log.warning("cancelling the stalled jobs failed: %s", exc)
            if step == "wedged" or self._stop.wait(grace):
                return
            try:
                if self._state(group) is None:
                    return
            except Exception:
                return


def _stage_metrics(sc: Any, stages: set[int]) -> tuple[tuple[int, ...], ...]:
    """Records and bytes the stages read and wrote so far (Spark's live task metrics);
    empty where this Spark does not expose its status store."""
    try:
        it = sc._jsc.sc().statusStore().activeStages().iterator()
    except Exception:
        return ()
    out = []
    while it.hasNext():
        s = it.next()
        if s.stageId() in stages:
            out.append((s.stageId(), s.inputRecords(), s.inputBytes(), s.outputRecords(),
                        s.shuffleReadRecords(), s.shuffleWriteRecords()))
    return tuple(sorted(out))


def driver_heap(spark: Any) -> str:
    """``, the driver's JVM heap 97% full (497 of 512 MB)``, or nothing if unknown."""
    try:
        usage = spark.sparkContext._jvm.java.lang.management.ManagementFactory \
            .getMemoryMXBean().getHeapMemoryUsage()
        used, top = int(usage.getUsed()), int(usage.getMax())
    except Exception:
        return ""
    if top <= 0:
        return ""
    return (f", the driver's JVM heap {100 * used // top}% full "
            f"({used >> 20} of {top >> 20} MB)")
