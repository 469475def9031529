"""Opening the store: lock and check every location, reconcile packs and catalogs, and
load what is held (task figures, partitions, generations, pack numbers, seals)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shuffled.storage.catalog import KeyGeneration
from shuffled.storage.disk import Disk
from shuffled.storage.lifecycle import reconcile
from shuffled.storage.ondisk import commits
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.commit.horizon import Horizon
from shuffled.storage.placement.packsource import PackSource
from shuffled.storage.tasks.seals import Seals
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")


@dataclass
class Opened:
    """What the start found: partials recovered, and committed ones dropped (no bytes)."""

    recovered: int = 0
    dropped: int = 0
    restored: int = 0  # rows the catalog had lost, read back from commit records


async def open_locations(disks: Sequence[Disk],
                         threads: IoThreads, fsync: bool) -> None:
    """Lock every location, check its format and open its catalog; on failure, undo."""
    opened: list[Disk] = []
    try:
        for disk in disks:
            loc = disk.location
            await threads.run(loc.open)
            opened.append(disk)
            await threads.run(reconcile.check_format, loc.path, fsync)
            loc.commit_key = await threads.run(commits.load_key, loc.path, fsync)
            await disk.on_writer(disk.catalog.open)
    except BaseException:
        for disk in opened:
            disk.location.close()
            await disk.on_writer(disk.catalog.close)
        raise


async def load(disks: Sequence[Disk], threads: IoThreads,
               book: TaskBook, horizon: Horizon, packs: PackSource, seals: Seals,
               kept: Mapping[int, frozenset[tuple[str, int]]] | None = None) -> Opened:
    """Reconcile every location and load its figures into the book (after
    :func:`open_locations`). ``kept``: per location, the packs evicted to deep storage,
    whose rows stay although their files are gone."""
    out = Opened()
    kept = kept or {}
    found_at = [await d.on_writer(reconcile.reconcile, d.path, d.catalog,
                                  kept.get(d.index, frozenset()), d.location.commit_key)
                for d in disks]
    dropped, touched = await _forget_shadowed(disks)
    out.dropped += dropped
    for index in touched:
        # A forgotten copy may have been its pack's only or last partial: settle that
        # location's packs again, or the pack stays on disk with nothing referring to it.
        disk = disks[index]
        # No commit records read this time: they would bring back the copies just
        # forgotten (the catalog is current since the first pass).
        again = await disk.on_writer(reconcile.reconcile, disk.path, disk.catalog,
                                     kept.get(index, frozenset()))
        again.dropped += found_at[index].dropped
        again.restored += found_at[index].restored
        again.max_pack = max(again.max_pack, found_at[index].max_pack)
        found_at[index] = again
    for disk, found in zip(disks, found_at, strict=True):
        loc, catalog = disk.location, disk.catalog
        out.dropped += found.dropped
        out.restored += found.restored
        packs.last_number = max(packs.last_number, found.max_pack)
        for sup, count, size, newest in await disk.on_writer(catalog.task_figures):
            entry = book.ensure(sup)
            entry.files += count
            entry.bytes += size
            entry.files_at[loc.index] = count
            loc.files += count
            horizon.observe(newest)
            out.recovered += count
        for sup, length in found.pack_bytes.items():
            if sup in book:
                book.entries[sup].pack_bytes[loc.index] = length
            loc.used_bytes += length
        for sup, keys in (await disk.on_writer(catalog.slot_keys)).items():
            entry = book.entries[sup]
            entry.slots = keys if not entry.slots else entry.slots | keys
    await seals.load()
    if out.recovered or out.dropped:
        log.info("recovered %d partial segments of %d tasks (%d dropped, %d restored from "
                 "commit records)", out.recovered, len(book.entries), out.dropped,
                 out.restored)
    return out


async def _forget_shadowed(disks: Sequence[Disk]) -> tuple[int, list[int]]:
    """Forget older copies of keys another location holds newer (left by a crash
    between a cross-location replace and its background forget), so that figures
    count every key once. One join per pair of locations, on the writer threads.
    Returns the rows forgotten and the indexes of the locations they were in."""
    stale: dict[int, list[KeyGeneration]] = {}
    for i, disk in enumerate(disks):
        for j in range(i + 1, len(disks)):
            other = disks[j].catalog.path
            for shared in await disk.on_writer(disk.catalog.shared_keys, other):
                here = shared.here
                if shared.there > here.generation:  # the copy here is the older one
                    stale.setdefault(i, []).append(here)
                else:
                    stale.setdefault(j, []).append(here._replace(generation=shared.there))
    dropped = 0
    for index, rows in stale.items():
        await disks[index].on_writer(disks[index].catalog.forget_many, rows)
        dropped += len(rows)
        log.warning("forgot %d older copies in %s of partials another location holds",
                    len(rows), disks[index].path)
    return dropped, sorted(stale)
