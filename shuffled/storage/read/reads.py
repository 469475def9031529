"""The store's reads: lookups, partitions and pages of a task's listing.

Queries run on the event loop against each location's catalog reader (point lookups and
index range scans: microseconds to a few milliseconds). A key can briefly have an older
copy in another location (replaced there, forgotten in the background): the newest
generation always wins.

With deep storage, a pack that is no longer local (its file missing, or its location out
of service) but was offloaded is read back from the tier into a local cache file
(:mod:`.deep.readback`) and the partials' metas point at it: every read path then serves
it as it serves any pack, so answers, digests, tokens and ranges stay the same.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Protocol

from shuffled.errors import BadRequest, Conflict, NotFound
from shuffled.protocol import PartialKey, PartitionKey
from shuffled.storage.catalog import Row
from shuffled.storage.oserrors import translate
from shuffled.storage.ondisk.records import PartialMeta
from shuffled.storage.threads import IoThreads


Cursor = tuple[int, int, int, str]


class Place(Protocol):
    """What reads need of a location: where its packs are, whether it serves."""

    @property
    def path(self) -> Path: ...
    @property
    def healthy(self) -> bool: ...


class Tier(Protocol):
    """What reads ask of deep storage (:class:`~shuffled.storage.deep.DeepStorage`; a
    protocol, so that this module does not import the tier it serves from)."""

    def copied(self, meta: PartialMeta) -> object | None: ...
    def cached_path(self, sup: str, location: int, pack: int) -> Path | None: ...
    async def local_copy(self, metas: Sequence[PartialMeta]) -> Path: ...


class Holds(Protocol):
    """Which tasks are held (the store's :class:`~shuffled.storage.tasks.book.TaskBook`)."""

    def __contains__(self, sup: str, /) -> bool: ...


class Queries(Protocol):
    """The read queries of a location's :class:`~shuffled.storage.catalog.Catalog` (a
    lost peer's manifest answers them too: :mod:`.deep.peers`)."""

    def lookup(self, sup: str, start: int, end: int, pid: int, sub: str) -> Row | None: ...
    def partition(self, sup: str, start: int, end: int, pid: int,
                  subs: Sequence[str] | None) -> list[Row]: ...
    def partitions(self, sup: str, slots: Sequence[tuple[int, int, int]]) -> list[Row]: ...
    def page(self, sup: str, after: Cursor | None, limit: int) -> list[Row]: ...


def encode_cursor(after: Cursor) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(after)).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> Cursor:
    """A cursor from :func:`encode_cursor`; BadRequest for anything else."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        start, end, pid, sub = json.loads(raw)
        if not (isinstance(start, int) and isinstance(end, int) and isinstance(pid, int)
                and isinstance(sub, str)):
            raise ValueError("types")
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"cursor {text[:40]!r} is not one this daemon handed out",
                         field="cursor") from exc
    return (start, end, pid, sub)


def _newest(rows: list[tuple[int, Row]]) -> dict[str, tuple[int, Row]]:
    """Per subtask id, the (location, row) of the newest generation."""
    best: dict[str, tuple[int, Row]] = {}
    for index, row in rows:
        held = best.get(row[4])
        if held is None or row[5] > held[1][5]:
            best[row[4]] = (index, row)
    return best


class Reader:
    """Queries over every location's catalog reader (event loop), opening on the I/O
    threads."""

    def __init__(self, locations: Sequence[Place], catalogs: Sequence[Queries],
                 book: Holds, threads: IoThreads,
                 deep: Tier | None = None) -> None:
        self.locations = list(locations)
        self.catalogs = list(catalogs)
        self.book = book
        self.threads = threads
        self.deep = deep

    def _meta(self, index: int, row: Row) -> PartialMeta:
        meta = PartialMeta.from_row(row, index, self.locations[index].path)
        if self.deep is not None:
            cached = self.deep.cached_path(meta.key.supervisor_task_id, index, meta.pack)
            if cached is not None:
                meta.path = cached
        return meta

    async def localize(self, metas: Sequence[PartialMeta], *, missing: bool = False) -> bool:
        """Point the metas of offloaded packs that are not local at copies read back from
        the tier: those of a location out of service, and with ``missing`` those whose
        file is gone (one look on the I/O threads). Whether any was."""
        if self.deep is None:
            return False
        groups: dict[tuple[int, int], list[PartialMeta]] = {}
        for meta in metas:
            if self.deep.copied(meta) is not None and self.deep.cached_path(
                    meta.key.supervisor_task_id, meta.location, meta.pack) is None:
                groups.setdefault((meta.location, meta.pack), []).append(meta)
        if not groups:
            return False
        away = [k for k in groups if not self.locations[k[0]].healthy]
        if missing:
            rest = [(k, groups[k][0].path) for k in groups if k not in away]

            def gone() -> list[tuple[int, int]]:
                return [k for k, path in rest if not path.exists()]
            away += await self.threads.run(gone)
        for k in away:
            await self.deep.local_copy(groups[k])
        return bool(away)

    def lookup(self, key: PartialKey) -> PartialMeta:
        found: PartialMeta | None = None
        if key.supervisor_task_id in self.book:
            i = key.interval
            for index, catalog in enumerate(self.catalogs):
                row = catalog.lookup(key.supervisor_task_id, i.start, i.end, key.partition_id,
                                     key.sub_task_id)
                if row is not None and (found is None or row[5] > found.generation):
                    found = self._meta(index, row)
        if found is None:
            raise NotFound(f"no partial segment {key}", key=str(key))
        return found

    def partition(self, key: PartitionKey, sub_task_ids: Sequence[str] | None = None,
                  ) -> list[PartialMeta]:
        """The partial segments of one partition, by subtask id; all must exist if named."""
        subs = list(dict.fromkeys(sub_task_ids)) if sub_task_ids is not None else None
        rows: list[tuple[int, Row]] = []
        if key.supervisor_task_id in self.book:
            i = key.interval
            for index, catalog in enumerate(self.catalogs):
                rows.extend((index, r) for r in catalog.partition(
                    key.supervisor_task_id, i.start, i.end, key.partition_id, subs))
        return self._chosen(key, subs, rows)

    def partitions(self, supervisor_task_id: str,
                   wanted: Sequence[tuple[PartitionKey, Sequence[str] | None]],
                   ) -> list[list[PartialMeta]]:
        """:meth:`partition` of each of ``wanted`` (a bulk read), with one query per
        location for them all; NotFound for the first one that is not all there."""
        slots = list(dict.fromkeys((k.interval.start, k.interval.end, k.partition_id)
                                   for k, _ in wanted))
        found: dict[tuple[int, int, int], list[tuple[int, Row]]] = {s: [] for s in slots}
        if supervisor_task_id in self.book:
            for index, catalog in enumerate(self.catalogs):
                for r in catalog.partitions(supervisor_task_id, slots):
                    found[(r[1], r[2], r[3])].append((index, r))
        out = []
        for key, subs in wanted:
            rows = found[(key.interval.start, key.interval.end, key.partition_id)]
            named = list(dict.fromkeys(subs)) if subs is not None else None
            if named is not None:
                keep = set(named)
                rows = [(i, r) for i, r in rows if r[4] in keep]
            out.append(self._chosen(key, named, rows))
        return out

    def _chosen(self, key: PartitionKey, subs: list[str] | None,
                rows: list[tuple[int, Row]]) -> list[PartialMeta]:
        """The newest copy of each subtask's partial among ``rows``, in subtask order (or
        the order named); NotFound if there is none, or a named one is missing."""
        best = _newest(rows)
        if subs is None:
            if not best:
                raise NotFound(
                    f"no partial segments of {key.supervisor_task_id} {key.interval} "
                    f"partition {key.partition_id}", partition=key.partition_id,
                )
            return [self._meta(*best[s]) for s in sorted(best)]
        missing = [s for s in subs if s not in best]
        if missing:
            raise NotFound(
                f"{key.supervisor_task_id} {key.interval} partition {key.partition_id} has "
                f"no partial segment from subtasks {missing[:20]}", missing=missing[:100],
            )
        return [self._meta(*best[s]) for s in subs]

    def page(self, supervisor_task_id: str, cursor: str | None, limit: int,
             ) -> tuple[list[PartialMeta], str | None]:
        """Up to ``limit`` partials of a task in (start, end, partitionId, subTaskId) order
        after ``cursor``, and the cursor of the next page (None after the last)."""
        after = decode_cursor(cursor) if cursor else None
        streams = []
        for index, catalog in enumerate(self.catalogs):
            # One more than asked: an older copy of a key elsewhere may be skipped below.
            rows = catalog.page(supervisor_task_id, after, limit + 1)
            streams.append([((r[1], r[2], r[3], r[4]), -r[5], index, r) for r in rows])
        out: list[PartialMeta] = []
        last: Cursor | None = None
        more = False
        for sort_key, _, index, row in heapq.merge(*streams):
            if sort_key == last:
                continue  # an older generation of the key just taken
            if len(out) == limit:
                more = True
                break
            out.append(self._meta(index, row))
            last = sort_key
        return out, (encode_cursor(last) if more and last is not None else None)

    async def open_partial(self, key: PartialKey) -> tuple[PartialMeta, IO[bytes]]:
        for _ in range(5):
            meta = self.lookup(key)
            try:
                await self.localize([meta])
                return meta, await self.threads.run(open, meta.path, "rb", 0)
            except FileNotFoundError:
                if await self.localize([meta], missing=True):
                    return meta, await self.threads.run(open, meta.path, "rb", 0)
                await asyncio.sleep(0)  # deleted meanwhile: look again
                continue
            except OSError as exc:
                raise translate(exc, str(self.locations[meta.location].path), "opening") from exc
        raise NotFound(f"no partial segment {key}", key=str(key))

    async def open_many(self, metas: Sequence[PartialMeta]) -> list[IO[bytes]]:
        """Open the packs of ``metas`` (each once) up front; one file object per meta."""
        await self.localize(metas)
        try:
            return await self._open_many(metas)
        except Conflict:
            if not await self.localize(metas, missing=True):
                raise
        return await self._open_many(metas)

    async def _open_many(self, metas: Sequence[PartialMeta]) -> list[IO[bytes]]:
        paths = list(dict.fromkeys(m.path for m in metas))

        def _open_all() -> dict[Path, IO[bytes]]:
            files: dict[Path, IO[bytes]] = {}
            try:
                for path in paths:
                    # Unbuffered: reads are positional (pread/sendfile).
                    files[path] = open(path, "rb", buffering=0)
            except BaseException:
                for fh in files.values():
                    fh.close()
                raise
            return files
        try:
            opened = await self.threads.run(_open_all)
        except FileNotFoundError as exc:
            raise Conflict("a partial segment of this partition was deleted while the "
                           "request started; retry") from exc
        except OSError as exc:
            raise translate(exc, "a location", "opening") from exc
        return [opened[m.path] for m in metas]
