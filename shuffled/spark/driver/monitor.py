"""Driver-side background duty while a job runs: keep shuffle data alive, report progress.

Keep-alive: the daemons expire a supervisor task's data some time after its last PUT/GET,
and listings do not count. At the start the driver PUTs a tiny marker partial segment
(subTaskId ``supervisor-keepalive``, never read by phase 2) on every daemon and then GETs it
every ``keepalive_seconds``, so data survives however long a phase takes. The final DELETE
removes the marker with everything else.

Progress: every ``progress_seconds`` the Spark status tracker's active stages are summarised
through the progress callback (only when something changed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pyarrow as pa

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey
from shuffled.spark.rows.rollup import to_ipc

log = logging.getLogger("shuffled.spark")

KEEPALIVE_SUB = "supervisor-keepalive"
_MARK_INTERVAL = Interval(0, 1)


def marker_key(task_id: str) -> PartialKey:
    return PartialKey(task_id, KEEPALIVE_SUB, _MARK_INTERVAL, 0)


class Monitor:
    """A daemon thread that pings the shuffle servers and reports stage progress."""

    def __init__(self, task_id: str, servers: list[str], *, token: str | None,
                 ca_file: str | None, keepalive_seconds: float, progress_seconds: float,
                 status: Callable[[], str | None] | None,
                 progress: Callable[[str], None] | None) -> None:
        self.task_id = task_id
        self.servers = servers
        self.token, self.ca_file = token, ca_file
        self.keepalive_seconds = keepalive_seconds
        self.progress_seconds = progress_seconds
        self.status = status
        self.progress = progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shuffled-monitor", daemon=True)
        self._last = ""

    def _client(self, server: str) -> ShuffleClient:
        return ShuffleClient(server, token=self.token, ca_file=self.ca_file, timeout=30.0)

    def start(self) -> None:
        """Check every server, plant the keep-alive markers, start the thread."""
        body = to_ipc(pa.table({"marker": pa.array([0], pa.int8())}))
        for server in self.servers:
            with self._client(server) as c:
                c.put_partial(marker_key(self.task_id), body)
        self._thread.start()

    def touch(self) -> None:
        for server in self.servers:
            try:
                with self._client(server) as c:
                    c.get_partial(marker_key(self.task_id))
            except Exception as exc:  # a daemon restart or outage: phase code retries
                log.warning("keep-alive of %s on %s failed: %s", self.task_id, server, exc)

    def _run(self) -> None:
        waited = 0.0
        step = min(self.keepalive_seconds, self.progress_seconds)
        while not self._stop.wait(step):
            waited += step
            if waited >= self.keepalive_seconds:
                waited = 0.0
                self.touch()
            self._report()

    def _report(self) -> None:
        if self.status is None or self.progress is None:
            return
        try:
            text = self.status()
        except Exception:
            return
        if text and text != self._last:
            self._last = text
            self.progress(text)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.keepalive_seconds + 60)


def stage_status(spark: object, label: Callable[[], str]) -> Callable[[], str | None]:
    """A function summarising the active Spark stages as ``<phase>: done/total tasks``."""

    def status() -> str | None:
        tracker = spark.sparkContext.statusTracker()  # type: ignore[attr-defined]
        done = total = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        if total == 0:
            return None
        return f"{label()}: {done}/{total} tasks done"

    return status
