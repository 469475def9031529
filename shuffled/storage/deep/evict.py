"""Eviction and spill: a full location makes room from what the tier already holds.

When an upload finds no location able to take it (free space would fall under
``free_space_reserve``, or ``max_bytes`` reached), before answering 507 the store asks
:meth:`Evictor.make_room`. For each healthy location still short, oldest first, it removes:

1. read-back cache files there (copies of tier objects: fetched again if read again);
2. local pack files of tasks whose offload is complete (the journal says so), oldest
   offload first: each pack only if its file is exactly the size the tier's copy was made
   of, and its task has no upload session open nor commit under way (its idle packs are
   closed first, so the task's next upload starts a new pack: an evicted pack never grows);
3. with nothing of that left, **spill**: the packs there of tasks not sealed (or whose
   offload failed), none being written (the same rule), are copied to the tier now, the
   same objects an offload makes, journaled, then evicted like the above. The seal's
   offload later copies only the rest and writes the manifest.

until the location has the upload's size plus :data:`EVICT_MARGIN` over its reserve. Each
eviction is journaled (``evicted``) before the file goes, so a restart's recovery keeps
the catalog rows of those packs, and reads serve them from the tier (:mod:`.readback`)
as they serve any pack no longer local. Runs under the task's lock: a DELETE or a seal of
it waits, as do its new uploads (for one task's copies at most).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shuffled.storage.disk import Disk
from shuffled.storage.ondisk import layout
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.deep import crypt, manifest
from shuffled.storage.deep.journal import Entry
from shuffled.storage.deep.offload import copy_pack
from shuffled.storage.tasks.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.placement.packsource import PackSource
from shuffled.storage.threads import IoThreads

if TYPE_CHECKING:
    from shuffled.storage.deep.service import DeepStorage

log = logging.getLogger("shuffled.storage")

#: Freed beyond the reserve and the upload's own size, so the next uploads do not each
#: stop to evict a little.
EVICT_MARGIN = 64 << 20


def free_bytes(root: Path) -> int:
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


def _sizes(paths: Sequence[Path]) -> list[int | None]:
    out: list[int | None] = []
    for path in paths:
        try:
            out.append(os.path.getsize(path))
        except FileNotFoundError:
            out.append(None)
    return out


def _unlink(paths: Sequence[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def kept(entries: dict[str, Entry]) -> dict[int, frozenset[tuple[str, int]]]:
    """Per location index, the (sup, pack) evicted: recovery keeps their rows."""
    out: dict[int, set[tuple[str, int]]] = {}
    for sup, entry in entries.items():
        if entry.deleting:
            continue
        for key in entry.evicted:
            location, pack = key.split(".")
            out.setdefault(int(location), set()).add((sup, int(pack)))
    return {i: frozenset(v) for i, v in out.items()}


def kept_slabs(entries: dict[str, Entry]) -> dict[int, frozenset[tuple[str, str, int, int]]]:
    """Per location index, the slabs (sup, sub, slab, attempt) evicted: recovery keeps
    their rows."""
    out: dict[int, set[tuple[str, str, int, int]]] = {}
    for sup, entry in entries.items():
        if entry.deleting:
            continue
        for key in entry.evicted_slabs:
            location, sub, slab, attempt = manifest.slab_key_parts(key)
            out.setdefault(location, set()).add((sup, sub, slab, attempt))
    return {i: frozenset(v) for i, v in out.items()}


class Evictor:
    """Frees local space from what the tier holds (event loop; files on the I/O threads)."""

    def __init__(self, *, deep: DeepStorage, disks: Sequence[Disk], threads: IoThreads, uploads: Uploads,
                 packs: PackSource, book: TaskBook, spill: bool = True,
                 on_evicted: Callable[[str], None] = lambda sup: None,
                 reading: Callable[[str], bool] = lambda sup: False) -> None:
        self.deep = deep
        self.disks = list(disks)
        self.locations = [d.location for d in self.disks]
        self.threads = threads
        self.uploads = uploads
        self.packs = packs
        self.book = book
        self.spill = spill
        self.on_evicted = on_evicted  # a task's slab files changed place: its index goes
        self.reading = reading  # a task's shards are being read: its slab files stay
        self.margin = EVICT_MARGIN
        self._lock = asyncio.Lock()  # one pass at a time: concurrent refusals share it

    async def _short(self, loc: Location, size: int) -> int:
        """Bytes ``loc`` must free to take ``size`` more with the margin (<= 0: none)."""
        free = await self.threads.run(free_bytes, loc.path)
        short = loc.reserve_bytes + size + self.margin - free
        if loc.max_bytes is not None:
            short = max(short, loc.used_bytes + loc.reserved_bytes + size + self.margin
                        - loc.max_bytes)
        return short

    async def make_room(self, size: int) -> bool:
        """No location could take ``size`` more bytes: evict (then spill) on the healthy
        ones until one can; whether one can now (the caller places again)."""
        async with self._lock:
            for loc in self.locations:
                if not loc.healthy:
                    continue
                short = await self._short(loc, size)
                if short > self.margin:
                    await self._free(loc, size, short)
                    short = await self._short(loc, size)
                if short <= self.margin:
                    return True
            return False

    async def _free(self, loc: Location, size: int, short: int) -> None:
        short -= await self._drop_cache(loc)
        if short <= 0:
            return
        entries = self.deep.journal.entries
        done = sorted((e for e in entries.values() if e.complete and not e.deleting),
                      key=lambda e: (e.offloaded_at or e.updated, e.sup))
        for entry in done:
            short -= await self._evict_task(loc, entry.sup, spill=False)
            if short <= 0:
                return
        if not self.spill:
            return
        # Spill: tasks with packs here and no complete copy, least recently used first.
        rest = sorted((t for t in self.book.all() if t.pack_bytes.get(loc.index)
                       and not self.deep.offloaded(t.supervisor_task_id)),
                      key=lambda t: (t.last_access, t.supervisor_task_id))
        for task in rest:
            short -= await self._evict_task(loc, task.supervisor_task_id, spill=True)
            if short <= 0:
                return

    async def _drop_cache(self, loc: Location) -> int:
        """Remove the read-back cache files held at ``loc``; the bytes freed."""
        root = layout.meta_dir(loc.path)
        slots = [(k, p) for k, p in self.deep.cached.items() if p.is_relative_to(root)]
        slabs = [(k, p) for k, p in self.deep.cached_slabs.items()
                 if p.is_relative_to(root) and not self.reading(k[0])]
        if not slots and not slabs:
            return 0
        for k, _ in slots:
            self.deep.cached.pop(k, None)  # later reads fetch again
        for slab, _ in slabs:
            self.deep.cached_slabs.pop(slab, None)
        for sup in {slab[0] for slab, _ in slabs}:
            self.on_evicted(sup)  # its index named the cached files
        paths = [p for _, p in slots] + [p for _, p in slabs]
        sizes = await self.threads.run(_sizes, paths)
        await self.threads.run(_unlink, paths)
        freed = sum(s or 0 for s in sizes)
        self.deep.stats.evicted_bytes += freed
        return freed

    async def _evict_task(self, loc: Location, sup: str, *, spill: bool) -> int:
        """Evict ``sup``'s packs at ``loc`` that the tier holds whole (copying them first
        with ``spill``); the bytes freed."""
        deep = self.deep
        if self.uploads.busy(sup):
            return 0  # being written (the upload asking for room, maybe): not now
        async with self.uploads.lock(sup):
            task = self.book.get(sup)
            if (task is None or self.uploads.busy(sup) or sup in deep.offloader.jobs
                    or deep.offloader.closing):
                return 0
            entry = deep.journal.entries.get(sup)
            if entry is not None and entry.deleting:
                return 0
            await self.packs.drop_task(sup)  # its next upload starts new packs
            if spill:
                try:
                    entry = await self._spill(loc, sup, entry)
                except Exception as exc:  # the tier failed: nothing of it is evicted
                    deep.stats.errors += 1
                    log.error("could not spill %s's packs at %s to %s: %s", sup, loc.path,
                              deep.tier.uri, exc)
                    return 0
            elif entry is None or not entry.complete:
                return 0
            assert entry is not None
            prefix = f"{loc.index}."
            keys = [k for k in entry.packs if k.startswith(prefix)]
            paths = [layout.pack_path(loc.path, sup, int(k[len(prefix):])) for k in keys]
            sizes = await self.threads.run(_sizes, paths)
            chosen = [(k, p) for k, p, s in zip(keys, paths, sizes, strict=True)
                      if s is not None and s == entry.packs[k].size]
            # Slab files copied (a slab never changes: its copy stands), not evicted yet.
            slab_prefix = f"{loc.index}/"
            slab_keys = [] if self.reading(sup) else [
                k for k in entry.slabs
                if k.startswith(slab_prefix) and k not in entry.evicted_slabs]
            slab_paths = [loc.path / sup / k[len(slab_prefix):] for k in slab_keys]
            slab_sizes = await self.threads.run(_sizes, slab_paths)
            slabs = [(k, p) for k, p, s in zip(slab_keys, slab_paths, slab_sizes, strict=True)
                     if s is not None and s == entry.slabs[k].size]
            if not chosen and not slabs:
                return 0
            entry.evicted |= {k for k, _ in chosen}
            entry.evicted_slabs |= {k for k, _ in slabs}
            try:
                await deep.journal.save(entry)  # before any file goes: recovery keeps rows
            except OSError as exc:
                log.warning("could not record the eviction of %s's packs: %s", sup, exc)
                return 0
            if slabs:
                self.on_evicted(sup)  # reads build the task's index again, from the tier
            await self.threads.run(_unlink, [p for _, p in chosen] + [p for _, p in slabs])
            freed = (sum(entry.packs[k].size for k, _ in chosen)
                     + sum(entry.slabs[k].size for k, _ in slabs))
            loc.used_bytes -= freed
            task.pack_bytes[loc.index] = task.pack_bytes.get(loc.index, 0) - freed
            deep.stats.evicted_bytes += freed
            deep.stats.evicted_packs += len(chosen)
            log.info("evicted %d packs and %d slabs of %s at %s (%d bytes, in %s)",
                     len(chosen), len(slabs), sup, loc.path, freed, deep.tier.uri)
            return freed

    async def _spill(self, loc: Location, sup: str, entry: Entry | None) -> Entry:
        """Copy ``sup``'s packs at ``loc`` not in the tier yet (or grown since); the
        journal entry recording them (the caller holds the task's lock)."""
        deep = self.deep
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(deep.executor, self.disks[loc.index].catalog.task_rows,
                                          sup)
        numbers = sorted({int(r.pack) for r in rows})
        paths = [layout.pack_path(loc.path, sup, n) for n in numbers]
        sizes = await self.threads.run(_sizes, paths)
        if entry is None:
            entry = Entry(sup)
        todo = [(n, p) for n, p, s in zip(numbers, paths, sizes, strict=True)
                if s is not None and (manifest.pack_key(loc.index, n) not in entry.packs
                                      or entry.packs[manifest.pack_key(loc.index, n)].size != s)]
        if not todo:
            return entry
        entry.complete = False
        await deep.journal.save(entry)  # before any object: a DELETE knows to clean up
        key = crypt.task_key(deep.secret, sup)
        offloader = deep.offloader
        never = threading.Event()
        for number, path in todo:
            name = manifest.pack_object(sup, deep.instance, loc.index, number)
            async with offloader.slots:
                copied = await loop.run_in_executor(
                    deep.executor, copy_pack, deep.tier, key, sup, name, path,
                    offloader.throttle, never)
            entry.packs[manifest.pack_key(loc.index, number)] = copied
            deep.stats.offloaded_bytes += copied.size
            deep.stats.offloaded_packs += 1
            deep.stats.spilled_packs += 1
            await deep.journal.save(entry)
        return entry
