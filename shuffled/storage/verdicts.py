"""The driver's verdicts: which daemons of a supervisor task its driver declared lost.

The driver of an ingestion watches its daemons with heartbeats (docs/failover.md); when it
declares one lost it tells every survivor (``PUT /tasks/{sup}/lost``), and a merge task
whose reads from a daemon fail asks a survivor (``GET /tasks/{sup}/lost``) instead of
retrying for the whole read budget. A verdict only grows (a lost daemon is never taken
back within a task: a daemon that answers again is read again by the driver's next round,
which the merge tasks learn from their own reads). Kept in memory only, like the failed
marks of :mod:`.seals`: bounded by tasks (oldest forgotten first) and by addresses per
task, and forgotten ``ttl`` seconds after the task's last verdict (readers that still ask
after that have long given up on their own retry budget).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

MAX_TASKS = 10_000  # tasks whose verdicts are remembered at most (oldest forgotten first)
MAX_LOST = 1_000  # addresses per task at most (a cluster's daemons, with room to spare)


class Verdicts:
    """Per supervisor task, the daemon addresses its driver declared lost (event loop only)."""

    def __init__(self, *, ttl: float, max_tasks: int = MAX_TASKS, max_lost: int = MAX_LOST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_tasks = max_tasks
        self.max_lost = max_lost
        self.clock = clock
        self._lost: OrderedDict[str, tuple[float, frozenset[str]]] = OrderedDict()

    def declare(self, sup: str, addresses: Iterable[str]) -> tuple[frozenset[str], bool]:
        """Add ``addresses`` to the task's lost daemons (idempotent): returns all of them
        and whether any was new. Past :attr:`max_lost` per task the newest are dropped
        (the caller refuses bodies that long, so only repeated growth gets here)."""
        known = self.lost(sup)
        merged = known | frozenset(addresses)
        if len(merged) > self.max_lost:
            merged = known | frozenset(sorted(merged - known)[:self.max_lost - len(known)])
        self._lost.pop(sup, None)
        self._lost[sup] = (self.clock(), merged)
        while len(self._lost) > self.max_tasks:
            self._lost.popitem(last=False)
        return merged, merged != known

    def lost(self, sup: str) -> frozenset[str]:
        """The daemons declared lost for ``sup`` (empty if none, or forgotten)."""
        entry = self._lost.get(sup)
        if entry is None:
            return frozenset()
        if self.clock() - entry[0] > self.ttl:
            del self._lost[sup]
            return frozenset()
        return entry[1]

    def __len__(self) -> int:
        return len(self._lost)
