"""The task book: the figures of every supervisor task held (event loop only).

Per task a :class:`~shuffled.storage.ondisk.records.TaskEntry`: bytes and partials held (per location too), its
partitions, what was served and received, last access (its expiry) and an access count.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shuffled.storage.ondisk.records import TaskEntry


class TaskBook:
    """Supervisor task id -> :class:`TaskEntry`."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.entries: dict[str, TaskEntry] = {}

    def get(self, sup: str) -> TaskEntry | None:
        return self.entries.get(sup)

    def all(self) -> list[TaskEntry]:
        return list(self.entries.values())

    def __contains__(self, sup: str) -> bool:
        return sup in self.entries

    def ensure(self, sup: str) -> TaskEntry:
        """The task's entry, created (last access now) if it had none."""
        entry = self.entries.get(sup)
        if entry is None:
            entry = self.entries[sup] = TaskEntry(sup, last_access=self.clock())
        return entry

    def pop(self, sup: str) -> TaskEntry | None:
        return self.entries.pop(sup, None)

    def touch(self, sup: str) -> None:
        """Refresh a task's last access (its expiry); a PUT or GET of its data does this."""
        entry = self.entries.get(sup)
        if entry is not None:
            entry.last_access = self.clock()
            entry.accesses += 1

    def record_served(self, sup: str, nbytes: int) -> None:
        entry = self.entries.get(sup)
        if entry is not None:
            entry.served_bytes += nbytes
            entry.served_requests += 1
