"""Long polling and task states for paged reads (Presto's current-state + max-wait pair).

:class:`TaskWatch` listens to the store (a commit landed, a seal, a delete) and wakes the
requests waiting on that supervisor task; it also keeps which tasks were marked failed
(explicitly, or by their DELETE), so that reads after a DELETE answer "failed", never
"empty and complete". Both are bounded: waiters by a setting (beyond it 503 + Retry-After),
failed marks by count and age. No polling anywhere: a waiter sleeps on an asyncio.Event.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from shuffled.errors import Overloaded

FAILED_MARKS = 100_000  # failed tasks remembered at most (oldest forgotten first)


class TaskWatch:
    """Wake-ups per supervisor task, and the failed marks."""

    def __init__(self, max_waiters: int, mark_ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_waiters = max_waiters
        self.mark_ttl = mark_ttl
        self.clock = clock
        self.waiting = 0
        self._events: dict[str, asyncio.Event] = {}
        self._failed: OrderedDict[str, float] = OrderedDict()

    def event(self, sup: str) -> asyncio.Event:
        """The event the next change of ``sup`` sets; take it BEFORE looking at the state,
        so that a change in between is not missed."""
        event = self._events.get(sup)
        if event is None:
            event = self._events[sup] = asyncio.Event()
        return event

    def notify(self, sup: str) -> None:
        """``sup`` changed: wake its waiters (the store's listener)."""
        event = self._events.pop(sup, None)
        if event is not None:
            event.set()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Room for one more waiter, or Overloaded (503) beyond the setting."""
        if self.waiting >= self.max_waiters:
            raise Overloaded(f"{self.waiting} requests are already waiting for news; "
                             "retry, or ask without maxWait", retry_after=1)
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Wait for ``event`` up to ``seconds``; True if it came (early), False on time."""
        async with self.slot():
            try:
                await asyncio.wait_for(event.wait(), seconds)
                return True
            except TimeoutError:
                return False

    def mark_failed(self, sup: str) -> None:
        self._failed.pop(sup, None)
        self._failed[sup] = self.clock()
        while len(self._failed) > FAILED_MARKS:
            self._failed.popitem(last=False)
        self.notify(sup)

    def failed(self, sup: str) -> bool:
        marked = self._failed.get(sup)
        if marked is None:
            return False
        if self.clock() - marked > self.mark_ttl:
            del self._failed[sup]
            return False
        return True


WATCH = web.AppKey("task_watch", TaskWatch)
