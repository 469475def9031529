"""Removing a supervisor task's data: a DELETE, an expiry, and what a failed one left.

Removing a task touches every location (its catalog rows, its packs, its seal and verdict)
and is made atomic by a tombstone (:mod:`shuffled.storage.ondisk.marks`, kind ``deleting``): under the task's
lock, its open upload sessions are refused and commits already under way land; the
tombstone is written (synced) on every healthy location before anything is removed;
then rows go from every catalog, packs and marks from every location (rows first: a pack
without rows is an orphan recovery removes); the tombstones go last. A crash in between
leaves a tombstone, and the start finishes the removal before anything is served
(:meth:`Removal.resume`): a reader sees the whole task or none of it, never a half.

A location that cannot remove everything (a read-only disk) is remembered and retried
(each sweep, or a retried DELETE), its tombstone kept, and the DELETE fails rather than
claim success; the task takes no uploads or seal until it is gone. With deep storage, the
task's objects in the tier go too: every daemon's copy on a DELETE, this daemon's on an
expiry (a tier that fails is retried each sweep, see :meth:`.deep.DeepStorage.forget`).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shuffled.storage.disk import Disk
from shuffled.storage.ondisk import marks
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.tasks.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.oserrors import marks_unhealthy, translate
from shuffled.storage.placement.packsource import PackSource
from shuffled.storage.ondisk.records import TaskEntry
from shuffled.storage.tasks.seals import Seals
from shuffled.storage.threads import IoThreads

if TYPE_CHECKING:
    from shuffled.storage.deep import DeepStorage

log = logging.getLogger("shuffled.storage")


def _remove_tree(path: Any) -> None:
    """``rm -r path``: an absent tree is fine, any other failure is raised."""

    def onerror(func: Any, name: str, exc_info: Any) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(path, onerror=onerror)


class Removal:
    """Deletes tasks everywhere; remembers and retries what it could not remove."""

    def __init__(self, *, disks: Sequence[Disk],
                 threads: IoThreads, book: TaskBook, uploads: Uploads, packs: PackSource,
                 seals: Seals, notify: Callable[[str], None], fsync: bool,
                 deep: DeepStorage | None = None) -> None:
        self.disks = list(disks)
        self.locations = [d.location for d in self.disks]
        self.threads = threads
        self.book = book
        self.uploads = uploads
        self.packs = packs
        self.seals = seals
        self.notify = notify
        self.fsync = fsync
        self.deep = deep
        # Supervisor tasks whose removal is not finished (their tombstones stand) ->
        # indexes of the locations still to finish.
        self.leftovers: dict[str, set[int]] = {}

    def deleting(self, sup: str) -> bool:
        """Whether a removal of ``sup`` is unfinished (it takes no uploads or seal)."""
        return sup in self.leftovers

    async def delete_task(self, sup: str, *, if_accesses: int | None = None,
                          everyone: bool = False) -> TaskEntry | None:
        """Remove everything of a supervisor task; idempotent. Uploads of it in flight are
        refused; commits already under way land first and are removed with the rest.
        Returns what was removed (None if nothing was held).

        With ``if_accesses`` (the sweeper's case) nothing happens unless the task's access
        count still equals it once the task's lock is held. ``everyone`` (the supervisor's
        DELETE: the task is over) removes every daemon's copy in deep storage, not only
        this daemon's (an expiry here: the others may still serve theirs).
        """
        async with self.uploads.lock(sup):
            current = self.book.get(sup)
            if if_accesses is not None and (current is None or current.accesses != if_accesses):
                return None
            await self.uploads.refuse(sup)
            held = current is not None or sup in self.leftovers
            if held:
                # Before anything goes: a crash from here on is finished at start.
                await marks.write_everywhere(self.locations, self.threads, marks.DELETING,
                                             sup, {}, self.fsync, "deleting")
            entry = self.book.pop(sup)
            if entry is not None:
                for index, size in entry.pack_bytes.items():
                    self.locations[index].used_bytes -= size
                for index, count in entry.files_at.items():
                    self.locations[index].files -= count
            await self.packs.drop_task(sup)
            self.seals.forget(sup)
            if held:
                await self._finish(sup, range(len(self.locations)), raise_first=True)
            if self.deep is not None:
                await self.deep.forget(sup, everyone=everyone)
        self.notify(sup)
        return entry

    async def _finish(self, sup: str, where: Sequence[int] | set[int], *,
                      raise_first: bool = False) -> bool:
        """Remove what ``sup`` has at the locations ``where``, then (once nothing is left
        anywhere) its tombstones. True when done; else the locations left are remembered
        (and with ``raise_first`` the first failure is raised, translated)."""
        left = set(self.leftovers.get(sup, ())) | set(where)
        failed: tuple[Location, OSError] | None = None
        for i in sorted(where):
            loc = self.locations[i]
            try:
                await self._remove_at(loc, sup)
            except OSError as exc:  # keep going: remove what can be removed everywhere
                failed = failed or (loc, exc)
                if marks_unhealthy(exc):
                    loc.mark_unhealthy(f"{exc.strerror} while deleting")
                continue
            left.discard(i)
        if not left:
            for loc in self.locations:  # the tombstones last: the removal is complete
                try:
                    await self.threads.run(marks.remove, loc.path, marks.DELETING, sup,
                                           self.fsync)
                except OSError as exc:
                    failed = failed or (loc, exc)
                    left.add(loc.index)
        if not left:
            self.leftovers.pop(sup, None)
            return True
        self.leftovers[sup] = left
        assert failed is not None
        where_, error = failed
        log.error("could not delete all of %s on %s: %s", sup, where_.path, error)
        if raise_first:
            raise translate(error, str(where_.path), f"deleting supervisor task {sup}")
        return False

    async def _remove_at(self, loc: Location, sup: str) -> None:
        """Forget ``sup``'s rows at ``loc``, then remove its packs and marks (rows first: a
        pack without rows is an orphan recovery removes; rows without a pack are dropped
        too)."""
        disk = self.disks[loc.index]
        await disk.on_writer(disk.catalog.delete_task, sup)
        await self.threads.run(_remove_tree, loc.path / sup)
        for kind in (marks.SEALS, marks.FAILED):
            await self.threads.run(marks.remove, loc.path, kind, sup, self.fsync)

    async def resume(self) -> list[str]:
        """At start, before anything is served: finish every removal a crash interrupted
        (a tombstone on any location). Returns the tasks still not fully removed (their
        locations are remembered and retried each sweep)."""
        pending: set[str] = set()
        for loc in self.locations:
            pending |= set(await self.threads.run(marks.read_all, loc.path, marks.DELETING))
        unfinished = []
        for sup in sorted(pending):
            log.warning("finishing the removal of %s, interrupted before this start", sup)
            if not await self._finish(sup, range(len(self.locations))):
                unfinished.append(sup)
        return unfinished

    async def remove_leftovers(self) -> list[str]:
        """Retry the removals that did not finish, on locations now healthy; returns the
        supervisor tasks fully removed."""
        done = []
        if self.deep is not None:
            await self.deep.retry_deletions()
        for sup in list(self.leftovers):
            async with self.uploads.lock(sup):
                where = {i for i in self.leftovers.get(sup, ()) if self.locations[i].healthy}
                if sup in self.leftovers and where and await self._finish(sup, where):
                    done.append(sup)
        return done
