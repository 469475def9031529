"""Generations and the commit horizon.

Every stored partial gets a generation, increasing (time-based, so that it also increases
across restarts): a newer copy of a key wins, and paged reads go in generation order.
Commits of two locations land in any order, so a partial with a lower generation can become
visible after a higher one: readers in commit order stop below the lowest generation still
being committed (the horizon), so they never skip a partial that lands later.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence


class Horizon:
    """Hands out generations and tracks those whose commit has not landed (event loop)."""

    def __init__(self) -> None:
        self.last = 0
        self._in_flight: set[int] = set()
        # The same generations as a min-heap: the horizon is its top once landed ones are
        # dropped from it (amortised O(log n) per generation, not a min() per page read).
        self._heap: list[int] = []

    def observe(self, generation: int) -> None:
        """A generation found on disk at start: new ones come after it."""
        self.last = max(self.last, generation)

    def next(self) -> int:
        self.last = max(time.time_ns(), self.last + 1)
        return self.last

    def take(self, count: int) -> range:
        """``count`` generations at once, as many :meth:`next` calls within one clock
        reading would give (one reading per submission, not one per partial)."""
        first = max(time.time_ns(), self.last + 1)
        self.last = first + count - 1
        return range(first, first + count)

    @property
    def horizon(self) -> int | None:
        """The lowest generation still being committed (None: none is): every partial below
        it that will ever be visible already is."""
        return self._heap[0] if self._heap else None  # land() keeps landed ones off the top

    def hold(self, generations: Sequence[int]) -> None:
        """Generations handed out whose commit has not landed: readers stop below them."""
        self._in_flight.update(generations)
        for g in generations:
            heapq.heappush(self._heap, g)

    def land(self, generations: Sequence[int]) -> None:
        """Those generations' commit landed (or failed): they no longer hold readers back."""
        self._in_flight.difference_update(generations)
        heap = self._heap
        while heap and heap[0] not in self._in_flight:
            heapq.heappop(heap)  # pruned here too, so the heap holds about what is in flight
