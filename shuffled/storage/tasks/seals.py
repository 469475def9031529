"""Seals and fail verdicts: a supervisor task's durable states.

A seal is written once phase 1 has committed (``PUT /tasks/{sup}/seal``); from then on a
partition of the task reads as complete once a reader has passed every partial of those
subtasks, and partials of other (failed or duplicate) attempts are not served by paged
reads. A fail verdict (``POST /tasks/{sup}/fail``) makes the task's reads answer "failed",
never complete, and refuses its uploads and seals until the task is deleted.

Both must survive a restart and outlive any expiry while the task is held, or a restarted
daemon would answer "not complete" for ever, or "complete" for a task its supervisor
failed. Each is one small versioned JSON file per task in every location's metadata
directory (``<location>/.shuffled/seals/<sup>.json``, ``.../failed/<sup>.json``, see
:mod:`shuffled.storage.ondisk.marks`), written atomically before the request is answered; any copy serves at start
(seal copies agree: a second seal may only add subtasks, and the newest replaces every
copy). Both go only with the task's data (:mod:`shuffled.storage.lifecycle.removal`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from shuffled.errors import Conflict
from shuffled.storage.ondisk import marks
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.tasks.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")


def read_seals(root: Path) -> dict[str, frozenset[str]]:
    """Every seal stored at ``root``; leftover temporary files are removed."""
    return {sup: frozenset(body["subTaskIds"])
            for sup, body in marks.read_all(root, marks.SEALS).items()}


DELETED_MARKS = 100_000  # deleted tasks remembered at most (oldest forgotten first)


class Seals:
    """The seals and fail verdicts of the tasks held, in memory and durable on every
    healthy location (event loop; file work on the I/O threads). A task's marks are
    changed under its lock.

    Beside them, in memory only, the tasks recently deleted: their reads answer "failed"
    (not "empty") for ``mark_ttl`` seconds, bounded in count, so a reader still asking
    after its supervisor's DELETE is told so. A deleted task holds nothing: after a restart
    its reads are simply never complete."""

    def __init__(self, *, locations: Sequence[Location], threads: IoThreads, uploads: Uploads,
                 book: TaskBook, fsync: bool, mark_ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.locations = list(locations)
        self.threads = threads
        self.uploads = uploads
        self.book = book
        self.fsync = fsync
        self.sealed: dict[str, frozenset[str]] = {}
        self.failed_tasks: set[str] = set()  # failed by their supervisor: durable
        self.mark_ttl = mark_ttl
        self.clock = clock
        self._deleted: OrderedDict[str, float] = OrderedDict()

    def mark_deleted(self, sup: str) -> None:
        """``sup`` is being deleted: its reads answer "failed" from now on (for a while),
        and it cannot be sealed. Uploads are not refused: a task id used again (a rerun)
        starts a new life with its first upload."""
        self._deleted.pop(sup, None)
        self._deleted[sup] = self.clock()
        while len(self._deleted) > DELETED_MARKS:
            self._deleted.popitem(last=False)

    def refuses_uploads(self, sup: str) -> bool:
        """Whether ``sup`` was failed by its supervisor's verdict (not only deleted)."""
        return sup in self.failed_tasks

    def revive(self, sup: str) -> None:
        """An upload to a deleted task: the id lives again (its reads are no longer
        "failed")."""
        self._deleted.pop(sup, None)

    def failed(self, sup: str) -> bool:
        if sup in self.failed_tasks:
            return True
        marked = self._deleted.get(sup)
        if marked is None:
            return False
        if self.clock() - marked > self.mark_ttl:
            del self._deleted[sup]
            return False
        return True

    async def fail(self, sup: str) -> bool:
        """Record its supervisor's fail verdict durably on every healthy location (True if
        new). From then on, until the task is deleted, its reads answer "failed", never
        complete, and its uploads and seals are refused; it is held (even empty) so that
        expiry and DELETE remove the verdict like any data."""
        async with self.uploads.lock(sup):
            if sup in self.failed_tasks:
                return False
            await marks.write_everywhere(self.locations, self.threads, marks.FAILED, sup, {},
                                         self.fsync, "failing")
            self.failed_tasks.add(sup)
            self.book.ensure(sup)
            self.book.touch(sup)
        return True

    async def load(self) -> None:
        """Read every location's seals and verdicts at start (a task held from then on,
        even empty)."""
        for loc in self.locations:
            for sup, subs in (await self.threads.run(read_seals, loc.path)).items():
                # Seals only grow: a location that missed an extension has a subset.
                self.sealed[sup] = self.sealed.get(sup, frozenset()) | subs
                self.book.ensure(sup)
            for sup in await self.threads.run(marks.read_all, loc.path, marks.FAILED):
                self.failed_tasks.add(sup)
                self.book.ensure(sup)

    async def seal(self, sup: str, sub_task_ids: Sequence[str]) -> bool:
        """Record that exactly ``sub_task_ids`` of the task are committed, durably on every
        healthy location. True if new, False if the same seal was already there (a retry);
        a seal that adds subtasks to the known one extends it (a supervisor that recomputed
        lost subtasks seals their replacements, docs/failover.md); any other different one
        is a Conflict: a committed subtask is never taken back. A task not held yet is held
        from now on (empty), so that expiry and DELETE remove its seal like any data."""
        subs = frozenset(sub_task_ids)
        if self.failed(sup):
            raise Conflict(f"{sup} was marked failed (or deleted): it cannot be sealed")
        async with self.uploads.lock(sup):
            known = self.sealed.get(sup)
            if known is not None:
                if not known <= subs:
                    raise Conflict(f"{sup} is already sealed with {len(known - subs)} "
                                   "subtasks this seal leaves out; a seal may only add "
                                   "subtasks", sealed=sorted(known)[:100])
                if known == subs:
                    return False
            if sup in self.failed_tasks:  # a verdict that landed while we waited for the lock
                raise Conflict(f"{sup} was marked failed: it cannot be sealed")
            await marks.write_everywhere(self.locations, self.threads, marks.SEALS, sup,
                                         {"subTaskIds": sorted(subs)}, self.fsync, "sealing")
            self.sealed[sup] = subs
            self.book.ensure(sup)
            self.book.touch(sup)
        return True

    def forget(self, sup: str) -> None:
        """Forget the task's seal and verdict (its removal is under way: :mod:`shuffled.storage.lifecycle.removal`
        removes their files with its data; the caller holds its lock)."""
        self.sealed.pop(sup, None)
        self.failed_tasks.discard(sup)
