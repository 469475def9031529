"""Orphans in the tier: task prefixes no daemon will remove (docs/deep-storage.md).

A task's ``PREFIX/<sup>/`` outlives the task when its DELETE never came (the pipeline
died) or reached no daemon, or when the daemon that wrote ``<sup>/<instance>/`` is lost
for good (it never expires its copy). After each expiry pass the sweeper runs
:meth:`Orphans.run`: it lists the task prefixes, skips the tasks this daemon holds, is
offloading or still deleting, and removes the whole prefix of each of the rest that is
over: with an overlord, the tasks it says finished or does not know (unreachable keeps
them); without one, those whose newest object is older than
``deep_storage_orphan_seconds``. At most ``limit`` prefixes are looked at per pass, the
next pass going on after the last one looked at, so a large tier is covered in turns.

Light on purpose (no object-store import): the sweeper imports it, and a daemon without
deep storage must not load pyarrow.fs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shuffled.storage.deep.service import DeepStorage

log = logging.getLogger("shuffled.storage")

LIMIT = 1000  # task prefixes looked at per pass

# Of ``sups``, those whose task is over (the overlord says finished, or does not know it).
Over = Callable[[list[str]], Awaitable[set[str]]]


@dataclass
class OrphanResult:
    """What one pass did, by supervisor task id."""

    looked_at: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Orphans:
    """The orphan sweep over ``deep``'s tier (event loop; requests on the tier's threads).

    ``held(sup)``: this daemon holds the task (its local data is live, whatever its copy).
    """

    def __init__(self, deep: DeepStorage, held: Callable[[str], bool], *, max_age: float,
                 limit: int = LIMIT) -> None:
        self.deep = deep
        self.held = held
        self.max_age = max_age
        self.limit = max(1, limit)
        self._after = ""  # the last prefix looked at: the next pass goes on from there
        # Without an overlord: a prefix whose newest object was young at the last look
        # cannot be an orphan before then + max_age; not listed again until that time.
        self._not_before: dict[str, float] = {}

    async def _tier(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.deep.executor, fn, *args)

    def busy(self, sup: str) -> bool:
        """This daemon holds ``sup``, or offloads it, or still owes its deletion."""
        deep = self.deep
        return (self.held(sup) or sup in deep.seals or sup in deep.journal.entries
                or sup in deep.offloader.jobs)

    def _turn(self, tasks: list[str], now: float) -> list[str]:
        """Up to ``limit`` candidates, going on after the last pass's."""
        ready = [s for s in tasks if not self.busy(s) and self._not_before.get(s, 0.0) <= now]
        ready = [s for s in ready if s > self._after] + [s for s in ready if s <= self._after]
        turn = ready[:self.limit]
        self._after = turn[-1] if len(turn) < len(ready) else ""
        return turn

    async def run(self, now: float, over: Over | None) -> OrphanResult:
        """One pass at time ``now``; ``over`` None: no overlord, the age rule decides.
        A tier that cannot be listed or deleted from is counted in the tier's errors and
        tried again next pass; it never raises for that."""
        result = OrphanResult()
        try:
            tasks: list[str] = await self._tier(self.deep.tier.tasks)
        except Exception as exc:
            self._failed(result, "listing the task prefixes", exc)
            return result
        listed = set(tasks)
        for sup in [s for s in self._not_before if s not in listed]:
            del self._not_before[sup]
        result.looked_at = self._turn(tasks, now)
        if not result.looked_at:
            return result
        if over is not None:
            doomed = sorted(await over(result.looked_at))
        else:
            doomed = []
            for sup in result.looked_at:
                try:
                    newest: float | None = await self._tier(self.deep.tier.newest, sup)
                except Exception as exc:
                    self._failed(result, f"listing {sup}", exc)
                    continue
                if newest is None or now - newest >= self.max_age:
                    doomed.append(sup)
                else:
                    self._not_before[sup] = newest + self.max_age
        for sup in doomed:
            await self._remove(sup, result)
        return result

    async def _remove(self, sup: str, result: OrphanResult) -> None:
        # Checked again right before: a task uploaded or sealed here meanwhile is live.
        # No await between this check and the removal's start.
        if self.busy(sup):
            return
        try:
            await self._tier(self.deep.tier.delete_prefix, sup)
        except Exception as exc:
            self._failed(result, f"removing {sup}", exc)
            return
        self._not_before.pop(sup, None)
        self.deep.stats.orphans_removed += 1
        result.removed.append(sup)
        log.info("removed the orphaned prefix of %s from %s", sup, self.deep.tier.uri)

    def _failed(self, result: OrphanResult, what: str, exc: Exception) -> None:
        self.deep.stats.errors += 1
        result.errors.append(f"{what}: {exc}")
        log.error("orphan sweep of %s: %s failed (tried again next sweep): %s",
                  self.deep.tier.uri, what, exc)
