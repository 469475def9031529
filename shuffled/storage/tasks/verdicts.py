"""The driver's verdicts: which daemons of a supervisor task its driver declared lost.

The driver of an ingestion watches its daemons with heartbeats (docs/failover.md); when it
declares one lost it tells every survivor (``PUT /tasks/{sup}/lost``), and a merge task
whose reads from a daemon fail asks a survivor (``GET /tasks/{sup}/lost``) instead of
retrying for the whole read budget. A verdict only grows (a lost daemon is never taken
back within a task: a daemon that answers again is read again by the driver's next round,
which the merge tasks learn from their own reads). Kept in memory only, like the failed
deletions of :mod:`shuffled.storage.tasks.seals`: forgotten ``ttl`` seconds after the task's last verdict
(readers that still ask after that have long given up on their own retry budget), bounded
by addresses per task and by the bytes of every address kept (``max_lost_marks_bytes``):
a declaration past that is refused with 503 until older ones lapse, never granted by
forgetting another task's.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from shuffled.errors import Overloaded

MAX_LOST = 1_000  # addresses per task at most (a cluster's daemons, with room to spare)
ENTRY_BYTES = 200  # what a task's entry costs besides its addresses (dict slot, tuple)


def _cost(addresses: frozenset[str]) -> int:
    return ENTRY_BYTES + sum(len(a) + 60 for a in addresses)  # 60: a str object's header


class Verdicts:
    """Per supervisor task, the daemon addresses its driver declared lost (event loop only)."""

    def __init__(self, *, ttl: float, max_bytes: int, max_lost: int = MAX_LOST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.max_lost = max_lost
        self.clock = clock
        self.bytes = 0  # the cost of every entry kept (:func:`_cost`)
        self._lost: OrderedDict[str, tuple[float, frozenset[str]]] = OrderedDict()

    def _expire(self) -> None:
        """Forget the entries past their ttl (the oldest declared are first)."""
        now = self.clock()
        while self._lost:
            sup, (declared, addresses) = next(iter(self._lost.items()))
            if now - declared <= self.ttl:
                return
            del self._lost[sup]
            self.bytes -= _cost(addresses)

    def declare(self, sup: str, addresses: Iterable[str]) -> tuple[frozenset[str], bool]:
        """Add ``addresses`` to the task's lost daemons (idempotent): returns all of them
        and whether any was new. Past :attr:`max_lost` per task the newest are dropped
        (the caller refuses bodies that long, so only repeated growth gets here); past
        :attr:`max_bytes` in all, Overloaded (503) and nothing changes."""
        self._expire()
        known = self.lost(sup)
        merged = known | frozenset(addresses)
        if len(merged) > self.max_lost:
            merged = known | frozenset(sorted(merged - known)[:self.max_lost - len(known)])
        before = _cost(known) if sup in self._lost else 0
        after = self.bytes - before + _cost(merged)
        if after > self.max_bytes:
            raise Overloaded(
                f"the lost-daemon verdicts kept here would take {after} bytes, over "
                f"max_lost_marks_bytes ({self.max_bytes}); older ones lapse "
                f"{self.ttl:g} s after they were declared", retry_after=max(1, int(self.ttl)))
        self._lost.pop(sup, None)
        self._lost[sup] = (self.clock(), merged)
        self.bytes = after
        return merged, merged != known

    def lost(self, sup: str) -> frozenset[str]:
        """The daemons declared lost for ``sup`` (empty if none, or forgotten)."""
        entry = self._lost.get(sup)
        if entry is None:
            return frozenset()
        if self.clock() - entry[0] > self.ttl:
            del self._lost[sup]
            self.bytes -= _cost(entry[1])
            return frozenset()
        return entry[1]

    def __len__(self) -> int:
        return len(self._lost)
