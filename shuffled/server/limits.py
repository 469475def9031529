"""Admission control: a bounded number of uploads/downloads in flight, 503 beyond it.

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
