"""Admission control: a bounded number of uploads/downloads in flight, and of partials
the bulk uploads in flight hold together; 503 beyond either.

Refusing early (instead of queueing) keeps memory flat under any concurrency; clients
back off on 503 + Retry-After.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from shuffled.errors import Overloaded


class Limiter:
    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.active = 0

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot, or raise Overloaded when all are taken."""
        if self.active >= self.limit:
            raise Overloaded(
                f"{self.active} {self.name} in flight (max_concurrent_{self.name}); retry shortly",
                retry_after=1,
            )
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


class Held:
    """A count the requests in flight share, each giving back what it took when it ends:
    the partials bulk uploads hold (their keys, records and answers) until they answer.
    Per upload that is bounded already (``max_bulk_partials``), but not across
    ``max_concurrent_uploads`` of them; past ``limit`` in all, Overloaded."""

    def __init__(self, name: str, setting: str, limit: int) -> None:
        self.name = name
        self.setting = setting
        self.limit = limit
        self.used = 0

    @contextmanager
    def share(self) -> Iterator[Share]:
        """One request's share, given back whole when the block ends."""
        mine = Share(self)
        try:
            yield mine
        finally:
            self.used -= mine.taken


class Share:
    """What one request holds of a :class:`Held` count."""

    def __init__(self, held: Held) -> None:
        self.held = held
        self.taken = 0

    def take(self) -> None:
        """One more, or Overloaded when the count is at its limit."""
        held = self.held
        if held.used >= held.limit:
            raise Overloaded(f"{held.used} {held.name} held by the requests in flight "
                             f"({held.setting}); retry shortly", retry_after=1)
        held.used += 1
        self.taken += 1
