"""From written to visible: a session's partials handed to their location's group commit,
and the task's figures updated once they land.

Every partial gets its generation here (:class:`~shuffled.storage.commit.horizon.Horizon`), held until its group
lands; the outcome says, per partial, the size of the copy it replaced (None: new), wherever
that copy was: an older copy in another location is forgotten there in the background.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from shuffled.protocol import PartialKey
from shuffled.storage.disk import Disk
from shuffled.storage.commit.written import Written
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.catalog import Row
from shuffled.storage.commit.group import GroupCommit, Landed
from shuffled.storage.commit.horizon import Horizon
from shuffled.storage.tasks.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.placement.packsource import PackSource
from shuffled.storage.ondisk import commits
from shuffled.storage.ondisk.packs import Pack
from shuffled.storage.ondisk.records import PartialMeta, TaskEntry

#: A group's commit: once landed, per partial the generation it replaced (None: new).
Landing = asyncio.Future[list[int | None]]


class Committer:
    """Submits written partials and books what landed (event loop only)."""

    def __init__(self, *, disks: Sequence[Disk],
                 commits: Sequence[GroupCommit], horizon: Horizon,
                 book: TaskBook, uploads: Uploads, packs: PackSource,
                 notify: Callable[[str], None]) -> None:
        self.disks = list(disks)
        self.locations = [d.location for d in self.disks]
        self.commits = list(commits)
        self.horizon = horizon
        self.book = book
        self.uploads = uploads
        self.packs = packs
        self.notify = notify

    def submit(self, loc: Location, written: Sequence[tuple[PartialKey, Written]],
               ) -> tuple[list[PartialMeta], Landing]:
        """Submit partials written to one pack to the location's group commit; the future
        gives, per partial, the size of the one it replaced (None if new) once durable."""
        now = time.time()
        index = loc.index
        metas = [w.meta(key, generation, index, now)
                 for (key, w), generation in zip(written, self.horizon.take(len(written)),
                                                   strict=True)]
        sup = metas[0].key.supervisor_task_id
        rows = [m.row() for m in metas]  # the record's and the catalog's, made once
        metas[-1].stored += self._record(loc, written[0][1].pack, rows)
        self.horizon.hold([m.generation for m in metas])
        self.uploads.committing(sup)
        # An older copy can only be elsewhere if this task already has the partition.
        entry = self.book.get(sup)
        several = len(self.locations) > 1 and entry is not None
        look = [several and m.slot_key in entry.slots for m in metas]  # type: ignore[union-attr]
        landed = self.commits[loc.index].submit(rows, written[0][1].pack, look)
        outcome: Landing = asyncio.get_running_loop().create_future()
        landed.add_done_callback(lambda f: self._landed(sup, metas, f, outcome))
        return metas, outcome

    @staticmethod
    def _record(loc: Location, pack: Pack, rows: list[Row]) -> int:
        """Append the commit record naming ``rows`` to their pack (on the loop: a few KB
        into the page cache costs less than a thread hop); its length, which counts as the
        last partial's bytes. The group commit's fdatasync makes it durable with theirs;
        the pack is idle (see SessionPacks.busy), so nothing is being appended to it
        meanwhile. Raises the OSError that stopped it (nothing was submitted then)."""
        assert not pack.busy, "a commit record would interleave with an append"
        record = commits.encode(loc.commit_key, pack.sup, pack.number, pack.size, rows)
        return pack.write([memoryview(record)])

    def _landed(self, sup: str, metas: list[PartialMeta], future: asyncio.Future[list[Landed]],
                outcome: Landing) -> None:
        """A group landed (or failed): update the task's figures, then resolve ``outcome``
        with the size each partial replaced, wherever it was. Runs on the loop."""
        self.horizon.land([m.generation for m in metas])
        self.uploads.committed(sup)
        if future.cancelled():
            outcome.cancel()
            return
        if future.exception() is not None:
            outcome.set_exception(future.exception())  # type: ignore[arg-type]
            return
        entry = self.book.ensure(sup)
        olds: list[int | None] = []
        # One submission is one location's: its figures are summed, then added once.
        index = metas[0].location
        loc = self.locations[index]
        stored = size = here = added = 0
        for meta, landed in zip(metas, future.result(), strict=True):
            old = landed.old
            stored += meta.stored
            if old is None:
                if landed.elsewhere is not None:  # another location's (see _forget)
                    old = self._forget(entry, *landed.elsewhere)
                here += 1
            added += old is None
            size += meta.size
            entry.bytes += meta.size - (old or 0)
            entry.slots.add(meta.slot_key)
            olds.append(old)
        entry.pack_bytes[index] = entry.pack_bytes.get(index, 0) + stored
        loc.used_bytes += stored
        entry.files_at[index] = entry.files_at.get(index, 0) + here
        loc.files += here
        entry.files += added
        entry.received_bytes += size
        entry.received_partials += len(metas)
        entry.last_access = self.book.clock()
        entry.accesses += 1
        outcome.set_result(olds)
        self.notify(sup)

    def _forget(self, entry: TaskEntry, index: int, row: Row) -> int:
        """An older copy of a key just replaced in another location: forget it there
        (readers already prefer the newest generation); returns its size."""
        disk = self.disks[index]
        self.packs.background(disk.on_writer(disk.catalog.forget, row))
        entry.files_at[index] = entry.files_at.get(index, 1) - 1
        self.locations[index].files -= 1
        return int(row.size)
