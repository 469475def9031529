"""Long polling for paged reads and task states (Presto's current-state + max-wait pair).

:class:`TaskWatch` listens to the store (a commit landed, a seal, a failure, a delete) and
wakes the requests waiting on that supervisor task. Waiters are bounded by a setting (beyond
it 503 + Retry-After). No polling anywhere: a waiter sleeps on an asyncio.Event. (What a
task's state is, failed marks included, is the store's: ``Store.state``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from shuffled.errors import Overloaded

class TaskWatch:
    """Wake-ups per supervisor task."""

    def __init__(self, max_waiters: int) -> None:
        self.max_waiters = max_waiters
        self.waiting = 0
        self.draining = False
        self._events: dict[str, asyncio.Event] = {}

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

    def wake_all(self) -> None:
        """The daemon is draining: every waiter answers now with what there is (the
        reader's next request goes to a replica or waits for the restart), and no new
        request waits."""
        self.draining = True
        events, self._events = self._events, {}
        for event in events.values():
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
        if self.draining:
            return False
        async with self.slot():
            try:
                await asyncio.wait_for(event.wait(), seconds)
                return True
            except TimeoutError:
                return False


WATCH = web.AppKey("task_watch", TaskWatch)
