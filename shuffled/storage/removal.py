"""Removing a supervisor task's data: a DELETE, an expiry, and what a failed one left.

Under the task's lock, its open upload sessions are refused and commits already under way
land first; then its rows go from every catalog and its packs from every location (rows
first: a pack without rows is an orphan recovery removes). A location that cannot remove
everything (a read-only disk) is remembered and retried (each sweep, or a retried DELETE),
and the DELETE fails rather than claim success: left alone, the data would be served again
after a restart. With deep storage, the task's objects in the tier go too: every daemon's
copy on a DELETE, this daemon's on an expiry (a tier that fails is retried each sweep, see
:meth:`.deep.DeepStorage.forget`).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shuffled.storage.book import TaskBook
from shuffled.storage.catalog import Catalog
from shuffled.storage.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.oserrors import marks_unhealthy, translate
from shuffled.storage.packsource import PackSource
from shuffled.storage.records import TaskEntry
from shuffled.storage.seals import Seals
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

    def __init__(self, *, locations: Sequence[Location], catalogs: Sequence[Catalog],
                 threads: IoThreads, book: TaskBook, uploads: Uploads, packs: PackSource,
                 seals: Seals, notify: Callable[[str], None],
                 deep: DeepStorage | None = None) -> None:
        self.locations = list(locations)
        self.catalogs = list(catalogs)
        self.threads = threads
        self.book = book
        self.uploads = uploads
        self.packs = packs
        self.seals = seals
        self.notify = notify
        self.deep = deep
        # Supervisor tasks a DELETE could not fully remove -> indexes of those locations.
        self.leftovers: dict[str, set[int]] = {}

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
            entry = self.book.pop(sup)
            if entry is not None:
                for index, size in entry.pack_bytes.items():
                    self.locations[index].used_bytes -= size
                for index, count in entry.files_at.items():
                    self.locations[index].files -= count
            await self.packs.drop_task(sup)
            failed: tuple[Location, OSError] | None = None
            for loc in self.locations:
                try:
                    await self._remove_at(loc, sup)
                except OSError as exc:  # keep going: remove what can be removed everywhere
                    failed = failed or (loc, exc)
                    self.leftovers.setdefault(sup, set()).add(loc.index)
                    if marks_unhealthy(exc):
                        loc.mark_unhealthy(f"{exc.strerror} while deleting")
            if failed is not None:
                where, error = failed
                log.error("could not delete all of %s on %s: %s", sup, where.path, error)
                raise translate(error, str(where.path), f"deleting supervisor task {sup}")
            self.leftovers.pop(sup, None)
            await self.seals.remove(sup)
            if self.deep is not None:
                await self.deep.forget(sup, everyone=everyone)
        self.notify(sup)
        return entry

    async def _remove_at(self, loc: Location, sup: str) -> None:
        """Forget ``sup``'s rows at ``loc``, then remove its packs (rows first: a pack
        without rows is an orphan recovery removes; rows without a pack are dropped too)."""
        catalog = self.catalogs[loc.index]
        await self.threads.on_writer(loc.index, catalog.delete_task, sup)
        await self.threads.run(_remove_tree, loc.path / sup)

    async def remove_leftovers(self) -> list[str]:
        """Retry removing what failed DELETEs left on locations now healthy; returns the
        supervisor tasks fully removed. A task written again since is live data: skipped."""
        done = []
        if self.deep is not None:
            await self.deep.retry_deletions()
        for sup in list(self.leftovers):
            async with self.uploads.lock(sup):
                where = self.leftovers.get(sup, set())
                if sup in self.book:
                    self.leftovers.pop(sup, None)
                    continue
                for i in sorted(where):
                    loc = self.locations[i]
                    if not loc.healthy:
                        continue
                    try:
                        await self._remove_at(loc, sup)
                    except OSError as exc:
                        log.warning("still cannot remove %s on %s: %s", sup, loc.path, exc)
                        continue
                    where.discard(i)
                if not where:
                    self.leftovers.pop(sup, None)
                    done.append(sup)
        return done
