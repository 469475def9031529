"""Uploads in flight per supervisor task, and the per-task lock.

A DELETE of a task (or its seal) takes the task's lock; an upload waits for a DELETE under
way before it starts, and a DELETE refuses the task's open upload sessions, lets commits
already under way land, and only then removes the task's files (:mod:`shuffled.storage.lifecycle.removal`).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Literal, Protocol


class Session(Protocol):
    def cancel(self) -> None: ...

    async def settled(self) -> None: ...


class TaskLock(asyncio.Lock):
    """A task's lock, which says how many wait for it (``waiting``): a sweep or a DELETE
    queued behind a commit can be seen, by the status page or a test, without asyncio's
    private fields."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    async def acquire(self) -> Literal[True]:
        if not self.locked():
            return await super().acquire()
        self.waiting += 1
        try:
            return await super().acquire()
        finally:
            self.waiting -= 1


@dataclass(slots=True)
class _Writes:
    """Uploads of one supervisor task in flight: sessions open, commits not yet landed."""

    sessions: set[Session] = field(default_factory=set)
    committing: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class Uploads:
    """Sessions and commits in flight by supervisor task (event loop only)."""

    def __init__(self) -> None:
        self._writes: dict[str, _Writes] = {}
        self._locks: weakref.WeakValueDictionary[str, TaskLock] = weakref.WeakValueDictionary()

    def lock(self, sup: str) -> TaskLock:
        lock = self._locks.get(sup)
        if lock is None:
            lock = TaskLock()
            self._locks[sup] = lock
        return lock

    def _of(self, sup: str) -> _Writes:
        writes = self._writes.get(sup)
        if writes is None:
            writes = self._writes[sup] = _Writes()
            writes.idle.set()
        return writes

    def _forget(self, sup: str) -> None:
        writes = self._writes.get(sup)
        if writes is not None and not writes.sessions and not writes.committing:
            del self._writes[sup]

    def busy(self, sup: str) -> bool:
        """Whether an upload session of ``sup`` is open or a commit of it under way (then
        its packs may be appended to: deep storage's eviction leaves the task alone)."""
        return sup in self._writes

    def open(self, sup: str, session: Session) -> None:
        self._of(sup).sessions.add(session)

    def close(self, sup: str, session: Session) -> None:
        self._of(sup).sessions.discard(session)
        self._forget(sup)

    def committing(self, sup: str) -> None:
        """A group of the task's partials was submitted to a group commit."""
        writes = self._of(sup)
        writes.committing += 1
        writes.idle.clear()

    def committed(self, sup: str) -> None:
        """That group landed (or failed)."""
        writes = self._writes[sup]
        writes.committing -= 1
        if not writes.committing:
            writes.idle.set()
            self._forget(sup)

    def deleting(self, sup: str) -> bool:
        """Whether a DELETE (or seal) of ``sup`` holds its lock: checked per partial of a
        bulk upload without a coroutine each (only then is :meth:`wait_for_delete` awaited)."""
        lock = self._locks.get(sup)
        return lock is not None and lock.locked()

    async def wait_for_delete(self, sup: str) -> None:
        """Return once no DELETE (or seal) of ``sup`` holds its lock."""
        if self.deleting(sup):
            async with self._locks[sup]:
                pass

    async def refuse(self, sup: str) -> None:
        """Cancel the task's open sessions, wait for their file work and for every commit
        under way to land (the caller holds the task's lock)."""
        writes = self._writes.get(sup)
        if writes is None:
            return
        sessions = list(writes.sessions)
        for session in sessions:
            session.cancel()
        await asyncio.gather(*(session.settled() for session in sessions))
        await writes.idle.wait()
