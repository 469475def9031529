"""The watchdog's rule on a status tracker that answers what a test says (the real Spark
cases are in test_no_hang.py): progress resets the clock; a stall fires once, cancels the
job group, then every job, then ends the JVM, each step only if the last did not stop it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from shuffled.spark.driver.watchdog import Watchdog


class _Session:
    """A session whose one job (7, stage 3) of group "g" finishes a task on each of the
    first ``progress`` polls, then none; cancels are recorded and change nothing."""

    def __init__(self, progress: int, cancelled: threading.Event) -> None:
        self.polls = 0
        self.progress = progress
        self.calls: list[str] = []
        self.cancelled = cancelled
        self.sparkContext = self

    def statusTracker(self) -> Any:  # noqa: N802 (Spark's name)
        return self

    def getJobIdsForGroup(self, group: str) -> list[int]:  # noqa: N802
        self.polls += 1
        return [7] if group == "g" else []

    def getJobInfo(self, job: int) -> Any:  # noqa: N802
        return SimpleNamespace(status="RUNNING", stageIds=[3])

    def getStageInfo(self, stage: int) -> Any:  # noqa: N802
        return SimpleNamespace(currentAttemptId=0, numTasks=1000, numActiveTasks=2,
                               numFailedTasks=0, name="collect at job.py:12",
                               numCompletedTasks=min(self.polls, self.progress))

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802
        self.calls.append(f"group {group}")

    def cancelAllJobs(self) -> None:  # noqa: N802
        self.calls.append("all")


def test_a_stall_cancels_harder_until_the_job_stops() -> None:
    wedged = threading.Event()
    session = _Session(progress=0, cancelled=wedged)
    dog = Watchdog(session, lambda: "g", lambda: "phase 2 (merge)", 0.3,
                   on_wedged=lambda: (session.calls.append("wedged"), wedged.set()),
                   poll_seconds=0.02, grace_seconds=0.1)
    dog.start()
    try:
        assert wedged.wait(10), session.calls
    finally:
        dog.stop()
    assert session.calls == ["group g", "all", "wedged"]
    assert dog.fired is not None
    what, hint = dog.fired
    assert what.startswith("phase 2 (merge) made no progress for 0 s (the stall timeout): "
                           "stage 3 (collect at job.py:12) had 0 of 1000 tasks done, "
                           "2 running"), what
    assert "--stall-timeout" in hint and "spark.driver.memory" in hint


def test_progress_resets_the_clock() -> None:
    """Tasks finish on each of the first 40 polls (0.8 s at 20 ms, longer than the 0.3 s
    timeout): the watchdog fires only after they stop, and once."""
    fired = threading.Event()
    session = _Session(progress=40, cancelled=fired)
    session.cancelJobGroup = lambda group: (session.calls.append(f"group {group}"),  # type: ignore[method-assign]
                                            fired.set())
    dog = Watchdog(session, lambda: "g", lambda: "phase 1", 0.3, poll_seconds=0.02,
                   grace_seconds=0.05)
    started = time.monotonic()
    dog.start()
    try:
        assert fired.wait(10)
        polls_at_fire = session.polls
    finally:
        dog.stop()
    assert polls_at_fire > 40  # not before the last progress
    assert time.monotonic() - started >= 0.3
    assert dog.fired is not None and "had 40 of 1000 tasks done" in dog.fired[0]
    assert session.calls[0] == "group g"


def test_no_running_job_never_stalls() -> None:
    session = _Session(progress=0, cancelled=threading.Event())
    dog = Watchdog(session, lambda: "other", lambda: "publish", 0.05, poll_seconds=0.01)
    dog.start()
    deadline = time.monotonic() + 5
    while session.polls < 30 and time.monotonic() < deadline:  # 30 polls: 6 timeouts
        session.cancelled.wait(0.01)
    dog.stop()
    assert session.polls >= 30 and dog.fired is None and session.calls == []
