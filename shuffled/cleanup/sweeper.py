"""The expiry sweeper: one idempotent pass over the store, run by the scheduler or a test.

Each pass probes unhealthy locations (so a recovered disk returns to service), finds the
supervisor tasks past their expiry, asks the overlord about them (if one is configured) and
then, task by task, extends, keeps or deletes as :mod:`shuffled.cleanup.policy` decides.

Right before deleting, the task's last access is read again: a GET or PUT that landed while
the overlord was being asked gives the task a new expiry and saves it. Deleting goes through
``Store.delete_task``, the same path as ``DELETE /tasks/{sup}``, so a concurrent DELETE, a
second sweep or a reader holding open files all race cleanly (readers keep the open file's
bytes; later readers get 404).

With deep storage, each pass then sweeps the tier's orphans
(:mod:`shuffled.storage.deep.orphans`): prefixes of tasks over (the overlord's word, or
their age without one) that no daemon will remove, a lost daemon's among them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shuffled.cleanup import policy
from shuffled.cleanup.overlord import OverlordClient
from shuffled.cleanup.policy import Action, Cause, TaskState
from shuffled.config import Settings
from shuffled.metrics import Metrics
from shuffled.storage import Store
from shuffled.storage.deep.orphans import Orphans

log = logging.getLogger("shuffled.cleanup")


@dataclass(frozen=True, kw_only=True)
class SweepRecord:
    """One finished pass, kept for the status page: when, how long, what it did."""

    finished: float
    seconds: float
    expired: int = 0
    extended: int = 0
    deleted: int = 0
    errors: int = 0
    failure: str | None = None  # the pass itself raised


HISTORY = 20  # sweeps remembered for the status page


@dataclass
class SweepResult:
    """What one pass did, by supervisor task id."""

    expired: list[str] = field(default_factory=list)
    extended: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)   # kept: overlord unreachable
    deleted: dict[str, Cause] = field(default_factory=dict)
    saved: list[str] = field(default_factory=list)     # accessed or deleted meanwhile
    errors: list[str] = field(default_factory=list)
    recovered_locations: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)  # task prefixes removed from the tier


class Sweeper:
    """Expiry sweeps over ``store``; ``overlord`` None means expiry alone decides."""

    def __init__(self, store: Store, settings: Settings, metrics: Metrics,
                 overlord: OverlordClient | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.overlord = overlord
        self.clock = clock or store.clock
        self._running = asyncio.Lock()
        self._stopping = False  # set by close(): a pass in progress stops at the next step
        self.closed = False
        self.history: deque[SweepRecord] = deque(maxlen=HISTORY)  # newest last
        self.orphans = None if store.deep is None else Orphans(
            store.deep, lambda sup: store.task(sup) is not None,
            max_age=settings.deep_storage_orphan_seconds)

    @classmethod
    def from_settings(cls, store: Store, settings: Settings, metrics: Metrics) -> Sweeper:
        overlord = OverlordClient(settings.overlord_url, metrics) if settings.overlord_url else None
        return cls(store, settings, metrics, overlord)

    async def close(self) -> None:
        """Stop a pass in progress at its next step (it finishes the overlord batch or the
        deletion under way), refuse new passes and close the overlord client."""
        self._stopping = True
        async with self._running:
            self.closed = True
            if self.overlord is not None:
                await self.overlord.close()

    async def run_once(self) -> SweepResult:
        """One sweep. Safe to call at any time and concurrently: passes run one at a time,
        and a second pass right after the first finds nothing more to do."""
        async with self._running:
            if self.closed:
                return SweepResult()
            self.metrics.sweeps.inc()
            started = time.monotonic()
            try:
                result = await self._sweep()
            except Exception as exc:
                self.metrics.sweep_failures.inc()
                self.history.append(SweepRecord(finished=self.clock(),
                                                seconds=time.monotonic() - started,
                                                failure=f"{type(exc).__name__}: {exc}"))
                raise
            if result.errors:
                self.metrics.sweep_failures.inc()
            self.metrics.last_sweep.set(self.clock())
            self.history.append(SweepRecord(
                finished=self.clock(), seconds=time.monotonic() - started,
                expired=len(result.expired), extended=len(result.extended),
                deleted=len(result.deleted), errors=len(result.errors)))
            return result

    async def _sweep(self) -> SweepResult:
        result = SweepResult()
        try:
            back = await self.store.probe_unhealthy()
            result.recovered_locations = [str(loc.path) for loc in back]
            for sup in await self.store.remove_leftovers():
                log.info("removed what an earlier DELETE of %s left behind", sup)
        except Exception as exc:  # a probe problem must not stop expiry
            log.exception("probing unhealthy locations failed")
            result.errors.append(f"probe: {exc}")
        await self._expire(result)
        if self.orphans is not None and not self._stopping:
            # The tier's failures count in shuffled_deep_errors_total, not as the sweep's.
            done = await self.orphans.run(self.clock(), None if self.overlord is None
                                          else self._over)
            result.orphans = done.removed
        return result

    async def _over(self, sups: list[str]) -> set[str]:
        assert self.overlord is not None
        states = await self.overlord.statuses(sups)
        return {sup for sup, state in states.items() if policy.is_over(state)}

    async def _expire(self, result: SweepResult) -> None:
        timeout = self.settings.expiry_timeout
        now = self.clock()
        # Snapshot (id, last access) of every expired task before any await.
        expired = {t.supervisor_task_id: t.accesses for t in self.store.tasks()
                   if policy.is_expired(t.last_access, now, timeout)}
        if not expired:
            return
        result.expired = sorted(expired)
        self.metrics.expired_tasks.inc(len(expired))

        states: dict[str, TaskState] | None = None
        if self.overlord is not None:
            states = {}
            size = max(1, self.overlord.batch_size)
            for start in range(0, len(result.expired), size):
                if self._stopping:
                    return
                states.update(await self.overlord.statuses(result.expired[start:start + size]))

        for sup in result.expired:
            if self._stopping:
                break
            try:
                await self._settle(sup, expired[sup], states, result)
            except Exception as exc:
                log.exception("expiry of supervisor task %s failed; retrying next sweep", sup)
                result.errors.append(f"{sup}: {exc}")

    async def _settle(self, sup: str, seen_accesses: int, states: dict[str, TaskState] | None,
                      result: SweepResult) -> None:
        # Re-read the task right before acting on it. There is no await between this check
        # and delete_task taking the task out of the index (an uncontended asyncio.Lock does
        # not yield), so a GET or PUT that refreshed the task cannot slip in between.
        entry = self.store.task(sup)
        if entry is None or entry.accesses != seen_accesses:
            result.saved.append(sup)  # deleted meanwhile, or read/written: new expiry
            return
        state = None if states is None else states.get(sup, TaskState.UNREACHABLE)
        decision = policy.decide(entry.last_access, self.clock(),
                                 expiry_timeout=self.settings.expiry_timeout,
                                 max_age=self.settings.max_age, state=state)
        if decision.action is Action.EXTEND:
            self.store.touch(sup)
            self.metrics.extended_tasks.inc()
            result.extended.append(sup)
            log.info("supervisor task %s expired but still runs; expiry extended", sup)
            return
        if decision.action is Action.RETRY:
            result.retried.append(sup)
            return
        if decision.action is not Action.DELETE:
            return
        assert decision.cause is not None
        # Checked again under the task's lock: a PUT committing meanwhile saves the task.
        removed = await self.store.delete_task(sup, if_accesses=seen_accesses)
        if removed is None:
            result.saved.append(sup)  # a DELETE request or a new access got there first
            return
        cause = decision.cause.value
        self.metrics.deleted_tasks.labels(cause).inc()
        self.metrics.deleted_bytes.labels(cause).inc(removed.bytes)
        result.deleted[sup] = decision.cause
        log.info("deleted supervisor task %s (%d files, %d bytes): %s", sup, removed.files,
                 removed.bytes, "overlord unreachable past max age" if decision.cause is Cause.MAX_AGE
                 else "expired")
