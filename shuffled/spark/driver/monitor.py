"""Driver-side background duty while a job runs: heartbeats to the daemons, progress.

Heartbeat (the data tunnel's PING/PONG): every ``heartbeat_seconds`` the driver sends
``POST .../tasks/{id}/heartbeat`` to every daemon, one thread per daemon so that a hung
one delays no other. The heartbeat refreshes the task's expiry (so data survives however
long a phase takes), and its answers keep a :class:`Liveness` per daemon: when it last
answered, since when it has not, whether its last answer said it was draining (a restart
is coming) and which process answered (a new ``instance`` is a restart). The pipeline asks
:meth:`Monitor.verdict` which daemons are gone before it trusts their data
(docs/failover.md).

Verdicts reach the merge tasks: a heartbeat thread whose daemon stays silent past the
same rule :meth:`Monitor.verdict` applies declares it lost at once (it asks again every
fraction of a second while it fails) and tells every surviving daemon
(``PUT .../tasks/{id}/lost``); each survivor's own thread tells it again after any answer
that finds it behind (one that missed the broadcast). A merge task whose reads from a
daemon fail asks a survivor (``GET .../lost``) and gives up on a daemon named there within
seconds, instead of retrying for ``shuffleRetrySeconds`` (:mod:`~..phase2.verdict`).

Progress: every ``progress_seconds`` the Spark status tracker's active stages and what the
daemons hold and served of the task are summarised through the progress callback (only
when something changed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from shuffled.client import ShuffleClient
from shuffled.client.http import NO_RETRY
from shuffled.errors import ShuffleError
from shuffled.spark.driver.report import size

log = logging.getLogger("shuffled.spark")


@dataclass
class Liveness:
    """What the heartbeats know of one daemon (monotonic seconds)."""

    last_ok: float | None = None
    failing_since: float | None = None
    draining: bool = False  # its last answer said it was shutting down
    refused: bool = False  # the last try found nothing listening (no process on the port)
    instance: str | None = None
    restarts: int = 0
    bytes: int = 0  # of this task, held there at the last answer
    partials: int = 0
    served: int = 0
    error: str = ""


@dataclass(frozen=True)
class Timing:
    """How the driver decides a daemon is gone: one whose port refuses connections (no
    process there) after ``refused_after`` seconds, one that stopped answering otherwise
    (timeouts, errors) after ``lost_after``, unless it said it was draining: then it gets
    ``restart_seconds`` (tuningConfig shuffleRetrySeconds) to come back."""

    heartbeat_seconds: float = 2.0
    lost_after: float = 2.0
    refused_after: float = 0.5
    restart_seconds: float = 30.0


class Monitor:
    """Heartbeat threads (one per daemon) and a progress thread."""

    def __init__(self, task_id: str, servers: Sequence[str], *, token: str | None,
                 ca_file: str | None, timing: Timing = Timing(), progress_seconds: float = 2.0,
                 status: Callable[[], str | None] | None = None,
                 progress: Callable[[str], None] | None = None,
                 quota: dict[str, int] | None = None) -> None:
        self.task_id = task_id
        self.quota = quota  # the spec's per-task quotas, asked of every daemon each beat
        self.servers = list(servers)
        self.token, self.ca_file = token, ca_file
        self.timing = timing
        self.progress_seconds = progress_seconds
        self.status = status
        self.progress = progress
        self.live = {s: Liveness() for s in self.servers}
        self._old: set[str] = set()  # daemons without the heartbeat route (warned once)
        # Daemons declared lost while the job ran (monotonic time of the declaration, and
        # how long they had been silent), and what each survivor has acknowledged of them.
        self.declared: dict[str, float] = {}
        self.declared_after: dict[str, float] = {}
        self._told: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._beat, args=(s,), daemon=True,
                                          name=f"shuffled-heartbeat-{i}")
                         for i, s in enumerate(self.servers)]
        self._threads.append(threading.Thread(target=self._report, daemon=True,
                                              name="shuffled-progress"))
        self._last = ""
        self._shown: set[str] = set()  # phases whose progress was shown
        self._show_lock = threading.Lock()

    def _client(self, server: str) -> ShuffleClient:
        return ShuffleClient(server, token=self.token, ca_file=self.ca_file,
                             timeout=max(5.0, self.timing.lost_after))

    def start(self) -> None:
        """One heartbeat to every daemon now (they answered their health check), then the
        threads."""
        for server in self.servers:
            self.beat(server)
        for t in self._threads:
            t.start()

    def beat(self, server: str, client: ShuffleClient | None = None) -> bool:
        """One heartbeat to ``server``, recorded; True if it answered."""
        now = time.monotonic()
        try:
            if client is None:
                with self._client(server) as c:
                    answer = c.heartbeat(self.task_id, quota=self.quota)
            else:
                answer = client.heartbeat(self.task_id, quota=self.quota)
        except Exception as exc:
            if isinstance(exc, ShuffleError) and exc.status in (404, 405):
                # A daemon older than the heartbeat route answered: alive, but its expiry
                # is not refreshed by this (it still is by every PUT and GET of the data).
                if server not in self._old:
                    self._old.add(server)
                    log.warning("shuffle daemon %s predates heartbeats (no %s route): "
                                "upgrade it; its data expires expiry_timeout after the last "
                                "read or write", server, "POST /tasks/{id}/heartbeat")
                answer = {}
            else:
                return self._failed(server, now, exc)
        with self._lock:
            live = self.live[server]
            if live.instance is not None and answer.get("instance") != live.instance:
                live.restarts += 1
                log.warning("shuffle daemon %s restarted (it keeps its data)", server)
            live.instance = answer.get("instance")
            live.last_ok, live.failing_since, live.error = now, None, ""
            live.draining = bool(answer.get("draining"))
            live.bytes, live.partials = int(answer.get("bytes", 0)), int(answer.get("partials", 0))
            live.served = int(answer.get("servedBytes", 0))
        return True

    def _failed(self, server: str, now: float, exc: BaseException) -> bool:
        with self._lock:
            live = self.live[server]
            if live.failing_since is None:
                live.failing_since = now
                log.warning("shuffle daemon %s stopped answering heartbeats: %s", server, exc)
            live.error = _short(exc)
            live.refused = live.error == "connection refused"
        return False

    def _beat(self, server: str) -> None:
        client = self._client(server)
        wait = self.timing.heartbeat_seconds
        try:
            while not self._stop.wait(wait):
                wait = self.timing.heartbeat_seconds
                if self.beat(server, client):
                    self._tell(server, client)
                    continue
                client.close()  # a fresh connection next time
                if server in self.declared:
                    continue
                silent = self._silent(server)
                if silent >= self.gone_for(server):
                    self._declare(server, silent)
                else:  # ask again soon: a lost daemon is declared within its grace
                    wait = min(wait, max(0.1, self.gone_for(server) / 2))
        finally:
            client.close()

    def _silent(self, server: str) -> float:
        with self._lock:
            since = self.live[server].failing_since
        return 0.0 if since is None else time.monotonic() - since

    def _declare(self, server: str, silent: float) -> None:
        """``server`` is lost: record it and tell every survivor now (one short try each;
        a survivor that missed it is told again by its own thread, :meth:`_tell`)."""
        with self._lock:
            if server in self.declared:
                return
            self.declared[server] = time.monotonic()
            self.declared_after[server] = round(silent, 3)
            survivors = [s for s in self.servers if s not in self.declared]
        log.warning("shuffle daemon %s declared lost (silent %.1f s); telling %d survivors",
                    server, silent, len(survivors))
        for other in survivors:
            with ShuffleClient(other, token=self.token, ca_file=self.ca_file,
                               timeout=2.0, retry=NO_RETRY) as c:
                self._tell(other, c)

    def _tell(self, server: str, client: ShuffleClient) -> None:
        """Bring ``server``'s copy of the verdicts up to date (if it is behind)."""
        with self._lock:
            lost = frozenset(self.declared) - {server}
            if not lost or lost <= self._told.get(server, frozenset()):
                return
        try:
            answer = client.declare_lost(self.task_id, sorted(lost))
        except Exception as exc:  # told again after its next answer
            if isinstance(exc, ShuffleError) and exc.status in (404, 405):
                answer = {}  # a daemon older than the route: its readers retry as before
            else:
                log.debug("could not tell %s the lost daemons: %s", server, exc)
                return
        with self._lock:
            self._told[server] = frozenset(answer.get("lost", lost)) | lost

    def gone_for(self, server: str) -> float:
        """Seconds ``server`` must stay silent before it counts as gone."""
        with self._lock:
            live = self.live[server]
        if live.draining:
            return self.timing.restart_seconds
        return self.timing.refused_after if live.refused else self.timing.lost_after

    def verdict(self, servers: Sequence[str] | None = None,
                backed: Collection[str] = ()) -> dict[str, str]:
        """The daemons (of ``servers``, default all) that are gone, with their last error.

        Asks each now; one that does not answer is asked again every half second until it
        answers (then it is alive: a restarted daemon keeps its data) or has been silent
        for :meth:`gone_for` seconds. Bounded by the longest of those. A ``backed`` daemon
        (its share is in deep storage) that refuses connections, without having said it
        drains, is gone at once: taking it for lost only sends its reads to the tier, which
        serves the same rows."""
        gone: dict[str, str] = {}
        for server in servers if servers is not None else self.servers:
            while not self.beat(server):
                with self._lock:
                    live = self.live[server]
                    silent = time.monotonic() - (live.failing_since or time.monotonic())
                    error = live.error
                    quick = live.refused and not live.draining and server in backed
                if silent >= self.gone_for(server) or quick:
                    gone[server] = error
                    break
                if self._stop.wait(min(0.5, self.gone_for(server) / 2)):
                    break
        return gone

    def held(self) -> tuple[int, int]:
        """Bytes held of this task and bytes served of it, summed over the daemons."""
        with self._lock:
            return (sum(v.bytes for v in self.live.values()),
                    sum(v.served for v in self.live.values()))

    def restarts(self) -> dict[str, int]:
        with self._lock:
            return {s: v.restarts for s, v in self.live.items() if v.restarts}

    def _report(self) -> None:
        # Spark is asked often, a line is shown every progress_seconds, or at once for a
        # phase not shown yet: a phase shorter than a tick (a one-task merge after native
        # phase-1 workers, which phase 2 reuses, takes a fraction of a second) still shows.
        shown_at, shown_phase = 0.0, ""
        while not self._stop.wait(min(0.1, self.progress_seconds)):
            if self.status is None or self.progress is None:
                continue
            try:
                text = self.status()
            except Exception:
                continue
            phase = (text or "").split(":", 1)[0]
            due = time.monotonic() - shown_at >= self.progress_seconds or phase != shown_phase
            if text and due and self._show(text, phase):
                shown_at, shown_phase = time.monotonic(), phase

    def _show(self, text: str, phase: str) -> bool:
        with self._show_lock:
            if text == self._last or self.progress is None:
                return False
            self._last = text
            self._shown.add(phase)
            self.progress(text)
            return True

    def settle(self) -> None:
        """The current phase is over: show its progress now if it never was (its jobs may
        have started and finished between two ticks). Called on the driver's thread."""
        if self.status is None or self.progress is None:
            return
        try:
            text = self.status()
        except Exception:
            return
        phase = (text or "").split(":", 1)[0]
        if text and phase not in self._shown:
            self._show(text, phase)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=self.timing.lost_after + 5)


def _short(exc: BaseException) -> str:
    """A few words for why a heartbeat failed ("connection refused", "timed out", ...)."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, TimeoutError):
        return "timed out"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return (getattr(exc, "message", None) or repr(exc))[:120]




def stage_status(spark: object, label: Callable[[], str],
                 held: Callable[[], tuple[int, int]] | None = None,
                 rows: Callable[[], int] | None = None, *,
                 group: Callable[[], str] | None = None,
                 shuffled: Callable[[], int] | None = None) -> Callable[[], str | None]:
    """A function summarising the phase's Spark stages as ``<phase>: done/total tasks done,
    N rows, ...``: those of the latest job of ``group`` (the phase's job group, finished
    stages included; ``<phase> (job K)`` once it has run several) or else the active ones; ``rows`` so far (see :class:`RowCount`), and what
    the daemons hold (phase 1: bytes shuffled so far) or served (phase 2: bytes read of
    those held; ``shuffled``: what finished phase-1 tasks reported, when it is more)."""

    def status() -> str | None:
        tracker = spark.sparkContext.statusTracker()  # type: ignore[attr-defined]
        done = total = 0
        stages: set[int] = set()
        jobs: list[int] = []
        if group is not None:
            # The latest job of the phase only: a phase that runs several jobs one after
            # the other (determine partitions) would otherwise show a total that grows as
            # each is submitted; the line says which job it counts instead.
            jobs = sorted(tracker.getJobIdsForGroup(group()))
            job = tracker.getJobInfo(jobs[-1]) if jobs else None
            if job is not None:
                stages.update(job.stageIds)
        if not stages:
            stages.update(tracker.getActiveStageIds())
        for sid in stages:
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        if total == 0:
            return None
        phase = label()
        step = f" (job {len(jobs)})" if len(jobs) > 1 else ""
        text = f"{phase}{step}: {done:,}/{total:,} tasks done"
        if rows is not None and not phase.startswith("determine"):  # counts phase rows only
            text += f", {rows():,} rows"
        if held is not None:
            stored, served = held()
            if phase.startswith("phase 1"):
                # what the daemons hold (last heartbeat) or what finished tasks reported,
                # whichever is further along
                text += f", {size(max(stored, shuffled() if shuffled else 0))} shuffled"
            elif phase.startswith("phase 2"):
                text += f", {size(served)} of {size(stored)} read"
        return text

    return status


class RowCount:
    """Rows a phase has handled so far, for the progress line: what its finished Python
    tasks added to a Spark accumulator (phase 1 read natively: input rows; phase 2: rows
    written) plus, while the JVM reads phase 1's input, the records its scan has read
    (Spark's live task metrics, updated with each executor heartbeat)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.acc = spark.sparkContext.accumulator(0)
        # Bytes the finished phase-1 tasks shuffled (their TaskStats), beside their rows:
        # the progress line's bytes never fall behind its rows (the daemons' own figure
        # comes with the next heartbeat, up to keepalive_seconds later).
        self.shuffled = spark.sparkContext.accumulator(0)
        self._start = 0
        self._shuffled_start = 0
        self.jvm = False

    def start(self, jvm: bool = False) -> None:
        """A new phase: count from zero; ``jvm`` when the JVM scan feeds it."""
        self._start = self.acc.value
        self._shuffled_start = self.shuffled.value
        self.jvm = jvm

    def shuffled_bytes(self) -> int:
        """Bytes the phase's finished tasks reported shuffled so far."""
        return int(self.shuffled.value - self._shuffled_start)

    def __call__(self) -> int:
        n = self.acc.value - self._start
        if self.jvm:
            n += self._scanned()
        return n

    def _scanned(self) -> int:
        try:
            stages = self.spark.sparkContext._jsc.sc().statusStore().activeStages()
            it = stages.iterator()
            total = 0
            while it.hasNext():
                total += int(it.next().inputRecords())
            return total
        except Exception:  # a Spark without this internal API: no figure, no failure
            return 0
