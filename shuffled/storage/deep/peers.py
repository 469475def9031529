"""Serving a lost peer's offloaded data: its manifest in the tier as a read-only catalog.

When a daemon is lost after its task reached the tier, any daemon with the same key file
can serve the lost one's share: the driver points phase 2 at
``/peers/<instance>/druid/worker/v1/shuffle/tasks/<sup>/...`` on a survivor. The survivor
reads ``<sup>/<instance>/manifest.json`` once (decrypted with the task's key, which every
daemon derives from the shared secret), and answers the read routes from its rows as the
peer would have: the same partials of the same sealed subtasks, the same generations (so
the same page tokens), the same bytes. A pack is fetched on first use into the read-back
cache (``.shuffled/deep-cache/<sup>/peer-<instance>/<location>/<sup>/<pack>.pack``, the
layout a pack has under a location, so the reads' paths need no translation), checked
against the CRC32C recorded when it was copied and each partial's own.

A manifest of version 2 lists the peer's slabs too (docs/slab.md): a shard read
(``POST .../shards``) fetches the slabs of the sealed subtasks it reads (not those it
leaves out) into ``.../peer-<instance>/slabs/``, each checked against the row the manifest
holds for it, and answers from them as the peer would have (the same index, so the same
rows and the same slab count).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuffled.errors import NotFound
from shuffled.protocol import PartitionKey, TaskDataState
from shuffled.storage.catalog import COLUMNS, Row
from shuffled.storage.deep.journal import Copied
from shuffled.storage.deep.manifest import SlabCopy, pack_key, slab_key
from shuffled.storage.deep.readback import slab_cache_path
from shuffled.storage.read.reads import Reader
from shuffled.storage.ondisk.records import CatalogRow, PartialMeta
from shuffled.storage.ondisk.slabrows import SlabRow
from shuffled.storage.threads import IoThreads

PEER_DIR = "peer-"


class ManifestCatalog:
    """The read queries of :class:`~shuffled.storage.catalog.Catalog` over the rows one
    location of the peer had (in memory: a manifest holds a task's rows, not a disk's)."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = sorted(rows, key=lambda r: (r.start, r.end, r.pid, r.sub))
        self._keys = [(r.start, r.end, r.pid, r.sub) for r in self.rows]
        self._slots: dict[tuple[int, int, int], list[Row]] = {}
        for r in self.rows:
            self._slots.setdefault(r.slot, []).append(r)

    def lookup(self, sup: str, start: int, end: int, pid: int, sub: str) -> Row | None:
        return next((r for r in self._slots.get((start, end, pid), ()) if r.sub == sub), None)

    def partition(self, sup: str, start: int, end: int, pid: int,
                  subs: Sequence[str] | None) -> list[Row]:
        rows = self._slots.get((start, end, pid), [])
        if subs is None:
            return list(rows)
        named = set(subs)
        return [r for r in rows if r.sub in named]

    def partitions(self, sup: str, slots: Sequence[tuple[int, int, int]]) -> list[Row]:
        return [r for s in slots for r in self._slots.get(s, ())]

    def page(self, sup: str, after: tuple[int, int, int, str] | None, limit: int) -> list[Row]:
        at = 0 if after is None else bisect.bisect_right(self._keys, after)
        return self.rows[at: at + limit]


@dataclass
class PeerPlace:
    """Where the reads find one of the peer's locations: its read-back cache."""

    index: int
    path: Path
    healthy: bool = True


Fetch = Callable[[Copied, Path, list[PartialMeta]], Awaitable[None]]
FetchSlab = Callable[[Copied, Path, SlabRow], Awaitable[Path]]


def newest(slabs: Sequence[SlabCopy]) -> list[SlabCopy]:
    """Per (subtask, slab) the highest attempt (as the daemon's shard reads take it)."""
    best: dict[tuple[str, int], SlabCopy] = {}
    for item in slabs:
        row = item[1]
        held = best.get((row.sub, row.slab))
        if held is None or held[1].attempt < row.attempt:
            best[(row.sub, row.slab)] = item
    return [best[k] for k in sorted(best)]


class PeerTask(Reader):
    """A lost peer's share of one sealed task, read from the tier (event loop).

    The store's :class:`~shuffled.storage.read.reads.Reader` over :class:`ManifestCatalog` s,
    with ``localize`` fetching packs from the tier instead of finding them on disk."""

    def __init__(self, *, sup: str, instance: str, subs: frozenset[str],
                 packs: dict[str, Copied], rows: Sequence[tuple[int, Row]], cache: Path,
                 threads: IoThreads, fetch: Fetch, slabs: Sequence[SlabCopy] = (),
                 fetch_slab: FetchSlab | None = None) -> None:
        by_location: dict[int, list[Row]] = {}
        for index, row in rows:
            if row.sup != sup:
                raise ValueError(f"a row of {row.sup!r} in the manifest of {sup!r}")
            by_location.setdefault(index, []).append(row)
        count = max(by_location, default=-1) + 1
        places = [PeerPlace(i, cache / f"{PEER_DIR}{instance}" / str(i))
                  for i in range(count)]
        catalogs = [ManifestCatalog(by_location.get(i, [])) for i in range(count)]
        super().__init__(places, catalogs, frozenset({sup}), threads)
        self.manifest_catalogs = catalogs
        self.sup = sup
        self.instance = instance
        self.subs = subs
        self.packs = packs
        self.rows = sum(len(c.rows) for c in catalogs)
        self._fetch = fetch
        self._here: set[tuple[int, int]] = set()  # packs fetched into the cache
        self._fetches: dict[tuple[int, int], asyncio.Future[None]] = {}
        for item in slabs:
            if item[1].sup != sup:
                raise ValueError(f"a slab of {item[1].sup!r} in the manifest of {sup!r}")
        self.slabs = list(slabs)
        self._slab_dir = cache / f"{PEER_DIR}{instance}"
        self._fetch_slab = fetch_slab
        self._slab_paths: dict[str, Path] = {}  # slab key -> its file in the cache
        self._slab_fetches: dict[str, asyncio.Future[Path]] = {}
        # The shard index over the slabs read, per "without" (built by the store: one
        # entry, as the store keeps one per task).
        self.slab_index: tuple[frozenset[str], Any] | None = None

    def view(self, key: PartitionKey, sub_task_ids: Sequence[str] | None, token: int,
             ) -> tuple[list[PartialMeta], bool, bool]:
        """:meth:`shuffled.storage.Store.view` of a sealed task: the peer's sealed
        subtasks' partials of ``key`` (of the named ones if named), in commit order;
        nothing is held back and the task is sealed."""
        try:
            metas = self.partition(key)
        except NotFound:  # an empty partition, as the store's view answers
            metas = []
        named = self.subs if sub_task_ids is None else self.subs & set(sub_task_ids)
        return sorted((m for m in metas if m.key.sub_task_id in named),
                      key=lambda m: m.generation), False, True

    def state(self, supervisor_task_id: str) -> TaskDataState:
        return TaskDataState.SEALED  # only a complete copy of a seal is ever read

    async def localize(self, metas: Sequence[PartialMeta], *, missing: bool = False) -> bool:
        """Fetch every pack of ``metas`` not yet in the cache (each once, concurrent
        readers share the fetch). Always true: a peer's packs are never local."""
        groups: dict[tuple[int, int], list[PartialMeta]] = {}
        for meta in metas:
            slot = (meta.location, meta.pack)
            if slot not in self._here:
                groups.setdefault(slot, []).append(meta)
        waits = []
        for slot, group in groups.items():
            running = self._fetches.get(slot)
            if running is None:
                running = asyncio.ensure_future(self._get(slot, group))
                self._fetches[slot] = running
                running.add_done_callback(self._forget(slot))
            waits.append(asyncio.shield(running))
        await asyncio.gather(*waits)  # the packs at once (the tier's threads bound them)
        return True

    async def warm(self) -> int:
        """Fetch every pack and slab of the share now (the driver asks as soon as it
        declares the peer lost, so the merge tasks' first reads find them here); the
        packs and slabs."""
        metas = [self._meta(index, row) for index, catalog in enumerate(self.manifest_catalogs)
                 for row in catalog.rows if row.sub in self.subs]
        await self.localize(metas)
        slabs = await self.slab_files(frozenset())
        return len({(m.location, m.pack) for m in metas}) + len(slabs)

    async def slab_files(self, without: frozenset[str]) -> list[tuple[Path, SlabRow]]:
        """The slabs of the sealed subtasks but ``without`` (the newest attempt of each),
        each fetched into the cache (once; at once), with its row from the manifest."""
        chosen = newest([s for s in self.slabs if s[1].sub in self.subs - without])
        paths = await asyncio.gather(*(self._slab(*item) for item in chosen))
        return [(path, row) for path, (_, row, _) in zip(paths, chosen, strict=True)]

    async def _slab(self, index: int, row: SlabRow, copied: Copied) -> Path:
        key = slab_key(index, row.sub, row.slab, row.attempt)
        path = self._slab_paths.get(key)
        if path is not None:
            return path
        if self._fetch_slab is None:
            raise ValueError(f"no slab reads for the share of {self.sup} from {self.instance}")
        running = self._slab_fetches.get(key)
        if running is None:
            running = asyncio.ensure_future(self._fetch_slab(
                copied, slab_cache_path(self._slab_dir, key, copied), row))
            self._slab_fetches[key] = running
            running.add_done_callback(lambda _: self._slab_fetches.pop(key, None))
        path = await asyncio.shield(running)
        self._slab_paths[key] = path
        return path

    def _forget(self, slot: tuple[int, int]) -> Callable[[asyncio.Future[None]], None]:
        def done(_: asyncio.Future[None]) -> None:
            self._fetches.pop(slot, None)
        return done

    async def _get(self, slot: tuple[int, int], metas: list[PartialMeta]) -> None:
        copied = self.packs.get(pack_key(*slot))
        if copied is None:
            raise ValueError(f"the manifest of {self.sup} from {self.instance} names no "
                             f"pack {pack_key(*slot)}")
        # Every partial of the pack is checked, not only those asked for now.
        everyone = [self._meta(slot[0], r) for r in self.manifest_catalogs[slot[0]].rows
                    if r.pack == slot[1]]
        await self._fetch(copied, metas[0].path, everyone)
        self._here.add(slot)


def parse_rows(body: dict[str, Any]) -> list[tuple[int, Row]]:
    """The (location, row) pairs of a parsed manifest; ValueError for another layout."""
    columns = body.get("columns")
    if columns != ["location", *COLUMNS]:
        raise ValueError(f"manifest columns {columns!r} are not this daemon's")
    return [(int(r[0]), CatalogRow._make(r[1:])) for r in body["rows"]]


def parse_packs(body: dict[str, Any]) -> dict[str, Copied]:
    return {p["key"]: Copied(p["object"], int(p["size"]), int(p["crc32c"]))
            for p in body["packs"]}
