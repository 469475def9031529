"""The store's slabs: uploads in, shards out, figures in the task book, rebuilt at start."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuffled.config import Settings
from shuffled.errors import Conflict, DigestMismatch, InvalidBody, NotFound, QuotaExceeded, SealedConflict, TooLarge
from shuffled.slab import wire
from shuffled.storage.disk import Disk
from shuffled.storage.ondisk import layout
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.catalog import Catalog
from shuffled.storage.tasks.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.placement.roundrobin import RoundRobin
from shuffled.storage.tasks.seals import Seals
from shuffled.storage.ondisk import slabrows as rows
from shuffled.storage.slabs import files, receive, shards
from shuffled.storage.ondisk.slabrows import SlabRow
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")


#: The files slabs are read from, given (location index, row, local path) each: their own
#: or, for those evicted to deep storage, copies read back (:mod:`shuffled.storage.deep`).
Localize = Callable[[str, Sequence[tuple[int, SlabRow, Path]]], Awaitable[list[Path]]]


@dataclass(frozen=True)
class SlabAck:
    """What an upload answers: the slab's key, where it went, whether it was new."""

    sub: str
    slab: int
    attempt: int
    rows: int
    size: int
    location: int
    new: bool

    def to_json(self) -> dict[str, Any]:
        return {"subTaskId": self.sub, "slabId": self.slab, "attempt": self.attempt,
                "rows": self.rows, "size": self.size, "new": self.new}


class _Upload:
    """An upload in flight, as :class:`~..inflight.Uploads` sees it: a DELETE cancels it
    and waits until it has settled (committed or discarded)."""

    def __init__(self) -> None:
        self.cancelled = False
        self.done = asyncio.Event()

    def cancel(self) -> None:
        self.cancelled = True

    async def settled(self) -> None:
        await self.done.wait()


class Slabs:
    """Slab uploads, shard reads and their figures (event loop; blocking work on threads)."""

    def __init__(self, *, settings: Settings, disks: Sequence[Disk], threads: IoThreads,
                 book: TaskBook,
                 uploads: Uploads, seals: Seals, placement: RoundRobin,
                 deleting: Callable[[str], bool], quota_of: Callable[[str], Any],
                 notify: Callable[[str], None], clock: Callable[[], float] = time.time,
                 localize: Localize | None = None) -> None:
        self.settings = settings
        self.disks = list(disks)
        self.locations = [d.location for d in self.disks]
        self.threads = threads
        self.book = book
        self.uploads = uploads
        self.seals = seals
        self.placement = placement
        self.deleting = deleting
        self.quota_of = quota_of
        self.notify = notify
        self.clock = clock
        self.localize = localize
        self._inflight: set[tuple[str, str, int, int]] = set()
        # Per task, its index over the sealed subtasks, less those a reader leaves out (one
        # entry per task: the readers of one ingestion all leave out the same ones).
        # Kept with the locations out of service when built: one going out of service
        # sends its slabs' reads elsewhere (deep storage), so the index is built again.
        self._indexes: dict[str, tuple[tuple[frozenset[str], frozenset[int]],
                                       shards.TaskIndex]] = {}
        self._reading: dict[str, int] = {}  # shard reads in flight per task

    @contextlib.contextmanager
    def reading(self, sup: str) -> Iterator[None]:
        """A shard read of ``sup`` from its index to its last file: its slab files (and
        copies read back) are not evicted meanwhile (:meth:`being_read`)."""
        self._reading[sup] = self._reading.get(sup, 0) + 1
        try:
            yield
        finally:
            left = self._reading[sup] - 1
            if left:
                self._reading[sup] = left
            else:
                del self._reading[sup]

    def being_read(self, sup: str) -> bool:
        return sup in self._reading

    # -- uploads ---------------------------------------------------------------------------

    def _admit(self, sup: str, header: wire.SlabHeader, size: int) -> None:
        if self.seals.refuses_uploads(sup):
            raise SealedConflict(f"{sup} was marked failed by its supervisor: it takes no "
                                 "more uploads; nothing was stored", supervisorTaskId=sup)
        if self.deleting(sup):
            raise SealedConflict(f"a DELETE of {sup} is not finished here: it takes no uploads "
                                 "until it is; nothing was stored", supervisorTaskId=sup)
        sealed = self.seals.sealed.get(sup)
        if sealed is not None and header.sub_task_id in sealed:
            raise SealedConflict(f"subtask {header.sub_task_id} of {sup} is sealed: its "
                                 "committed data never changes; nothing was stored",
                                 supervisorTaskId=sup, subTaskId=header.sub_task_id)
        self.seals.revive(sup)  # a deleted task's id lives again, as with a partial
        quota = self.quota_of(sup)
        entry = self.book.get(sup)
        held = entry.bytes if entry else 0
        if quota.bytes and held + size > quota.bytes:
            raise QuotaExceeded(f"task {sup} would hold {held + size} bytes on this daemon, "
                                f"over its quota of {quota.bytes}; nothing was stored",
                                quota="bytes", limit=quota.bytes, supervisorTaskId=sup)
        if quota.partials and (entry.files if entry else 0) + 1 > quota.partials:
            raise QuotaExceeded(f"task {sup} would hold more than its quota of "
                                f"{quota.partials} partial segments and slabs on this daemon; "
                                "nothing was stored", quota="partials", limit=quota.partials,
                                supervisorTaskId=sup)

    def _held(self, sup: str, name: files.SlabName) -> SlabRow | None:
        for catalog in (d.catalog for d in self.disks):
            found = rows.get(catalog.reader, sup, name.sub, name.slab, name.attempt)
            if found is not None:
                return found
        return None

    async def receive(self, sup: str, body: AsyncIterator[bytes],
                      content_length: int | None) -> SlabAck:
        """Store one slab; durable on return. Raises InvalidBody, DigestMismatch, TooLarge,
        Conflict, SealedConflict, QuotaExceeded, InsufficientStorage or OSError; whatever
        it raises, nothing is left on disk."""
        s = self.settings
        if content_length is None:
            raise InvalidBody("a slab upload needs a Content-Length (its prefix names every "
                              "section's length)", field="Content-Length")
        if content_length > s.max_partial_bytes:
            raise TooLarge(f"a slab of {content_length} bytes is over max_upload_bytes "
                           f"({s.max_partial_bytes})", limit=s.max_partial_bytes)
        await self.uploads.wait_for_delete(sup)
        pull = receive.Pull(body)
        prefix, header, head, index_raw, stats_raw = await receive.sections(
            pull, content_length=content_length, max_index=s.max_slab_index_bytes,
            max_stats=s.max_slab_index_bytes, max_data=s.max_partial_bytes)
        name = files.SlabName(header.sub_task_id, header.slab_id, header.attempt)
        index = await self.threads.run(receive.check_sections, prefix, header, index_raw,
                                       stats_raw)
        if index.num_rows and int(index.column("length").to_numpy().max()) > s.max_slab_batch_bytes:
            raise InvalidBody(f"a slab's batches are at most max_slab_batch_bytes "
                              f"({s.max_slab_batch_bytes}) each: a read trims a batch whole")
        key = (sup, *name)
        if key in self._inflight:
            raise Conflict(f"slab {name.slab} of subtask {name.sub} of {sup} is being "
                           "uploaded by another request; retry once it has answered",
                           supervisorTaskId=sup, subTaskId=name.sub)
        self._admit(sup, header, content_length)
        existing = self._held(sup, name)
        upload = _Upload()
        self._inflight.add(key)
        self.uploads.open(sup, upload)
        loc: Location | None = None
        tmp: Path | None = None
        fd: int | None = None
        try:
            if existing is not None:
                async for _ in pull.rest():  # the body is read, not stored
                    pass
                receive.held_elsewhere(existing.crc, header.crc_data, name, sup)
                return SlabAck(name.sub, name.slab, name.attempt, existing.rows,
                               existing.size, -1, new=False)
            loc = self.placement.choose(content_length)
            loc.reserved_bytes += content_length
            tmp, opened = await self.threads.run(receive.open_tmp, loc.path, sup, name)
            fd = opened
            await self.threads.run(receive.write, opened, head + index_raw + stats_raw, 0)
            crc = await receive.stream_data(pull, opened, self.threads.run, prefix.data_len)
            if crc != header.crc_data:
                raise DigestMismatch("a slab's data section fails its CRC32C")
            await self.threads.run(receive.check_data, opened, prefix.data_at, prefix.data_len,
                                   prefix.kind, index)
            if upload.cancelled or self.deleting(sup):
                raise Conflict(f"{sup} was deleted while this slab arrived; nothing was "
                               "stored", supervisorTaskId=sup)
            row = SlabRow(sup, name.sub, name.slab, name.attempt, int(prefix.kind),
                          content_length, header.rows, prefix.data_at, prefix.data_len,
                          header.crc_data, self.clock(), index_raw, stats_raw)
            final = files.path_of(loc.path, sup, name)
            self.uploads.committing(sup)
            try:
                await self.disks[loc.index].on_writer(self._commit, loc.index, opened, tmp,
                                                      final, row)
            finally:
                self.uploads.committed(sup)
            fd = tmp = None
            self._count(sup, loc, content_length, +1)
            entry = self.book.ensure(sup)
            entry.received_bytes += content_length
            entry.received_partials += 1
            self._indexes.pop(sup, None)
            self.notify(sup)
            return SlabAck(name.sub, name.slab, name.attempt, header.rows, content_length,
                           loc.index, new=True)
        finally:
            if loc is not None:
                loc.reserved_bytes -= content_length
            if tmp is not None:
                await asyncio.shield(self.threads.run(files.discard, fd, tmp))
            self._inflight.discard(key)
            self.uploads.close(sup, upload)
            upload.done.set()

    def _commit(self, index: int, fd: int, tmp: Path, final: Path, row: SlabRow) -> None:
        """Writer thread: sync and rename the file, then its row (not synced: the file is
        the source of truth, :meth:`Catalog.insert_slab`)."""
        files.publish(fd, tmp, final, self.settings.fsync)
        try:
            self.disks[index].catalog.insert_slab(row)
        except OSError:
            os.unlink(final)  # no row, no file: the upload failed as a whole
            raise

    def _count(self, sup: str, loc: Location, size: int, count: int) -> None:
        entry = self.book.ensure(sup)
        entry.bytes += size
        entry.files += count
        entry.files_at[loc.index] = entry.files_at.get(loc.index, 0) + count
        entry.pack_bytes[loc.index] = entry.pack_bytes.get(loc.index, 0) + size
        loc.used_bytes += size
        loc.files += count

    # -- reads -----------------------------------------------------------------------------

    async def task_index(self, sup: str, without: frozenset[str] = frozenset(),
                         ) -> shards.TaskIndex:
        """The task's index over the slabs of its sealed subtasks but ``without`` (those a
        supervisor superseded by recomputing them: docs/slab.md, "A lost daemon")."""
        if self.seals.failed(sup):
            raise Conflict(f"{sup} was marked failed (or is being deleted): its slabs are "
                           "not served", supervisorTaskId=sup, state="failed")
        sealed = self.seals.sealed.get(sup)
        if sealed is None:
            if sup not in self.book:
                raise NotFound(f"no data of supervisor task {sup} here", supervisorTaskId=sup)
            raise Conflict(f"{sup} is not sealed: a shard is read from the slabs of the "
                           "sealed subtasks only", supervisorTaskId=sup, state="running")
        held = self._indexes.get(sup)
        down = frozenset(loc.index for loc in self.locations if not loc.healthy)
        if held is not None and held[0] == (without, down):
            return held[1]
        held_rows: list[tuple[int, SlabRow, Path]] = []
        served = sealed - without
        for disk in self.disks:
            loc = disk.location
            for row in await disk.on_writer(rows.of_task, disk.catalog.writer, sup, served):
                held_rows.append((loc.index, row, files.path_of(loc.path, sup, files.SlabName(
                    row.sub, row.slab, row.attempt))))
        paths = ([p for _, _, p in held_rows] if self.localize is None
                 else await self.localize(sup, held_rows))
        found = [(path, row) for path, (_, row, _) in zip(paths, held_rows, strict=True)]
        built = await self.threads.run(shards.build, found)
        if self.seals.sealed.get(sup) is sealed:  # nothing changed meanwhile
            self._indexes[sup] = ((without, down), built)
        return built

    async def shard(self, sup: str, start: int, end: int, key_from: bytes | None,
                    key_to: bytes | None) -> tuple[shards.ShardRead, int]:
        """The shard's parts (the caller sends them, then closes the read) and the slab
        count of the sealed subtasks."""
        with self.reading(sup):  # the files are open on return
            ti = await self.task_index(sup)
            read = await self.threads.run(shards.read, ti, start, end, key_from, key_to)
        return read, ti.slabs

    def forget(self, sup: str) -> None:
        """The task changed (sealed, failed, deleted): its index is built again."""
        self._indexes.pop(sup, None)

    # -- start -----------------------------------------------------------------------------

    async def load(self, kept: dict[int, frozenset[tuple[str, str, int, int]]] | None = None,
                   ) -> int:
        """Reconcile slab files and rows at every location, count them in the book;
        returns the slabs held. ``kept``: per location, the slabs (sup, sub, slab,
        attempt) evicted to deep storage: their rows stay, their bytes are not counted."""
        total = 0
        for disk in self.disks:
            loc = disk.location
            found = await disk.on_writer(reconcile_slabs, loc.path, disk.catalog, self.settings,
                                         (kept or {}).get(loc.index, frozenset()))
            for sup, count, size in found:
                self._count(sup, loc, size, count)
                total += count
        return total


def _file_row(path: Path, sup: str, name: files.SlabName, settings: Settings) -> SlabRow:
    """A slab file's catalog row, read back from the file (its prefix, header, sections);
    InvalidBody if it is not a whole, valid slab."""
    with open(path, "rb") as f:
        raw = f.read(wire.PREFIX_LEN)
        prefix = wire.parse_prefix(raw, max_index=settings.max_slab_index_bytes,
                                   max_stats=settings.max_slab_index_bytes,
                                   max_data=settings.max_partial_bytes)
        header = wire.parse_header(prefix, f.read(prefix.header_len))
        index_raw = f.read(prefix.index_len)
        stats_raw = f.read(prefix.stats_len)
        size = os.fstat(f.fileno()).st_size
    if size != prefix.total or (header.sub_task_id, header.slab_id, header.attempt) != name:
        raise InvalidBody(f"{path} is not the whole slab its name and prefix say")
    index = receive.check_sections(prefix, header, index_raw, stats_raw)
    fd = os.open(path, os.O_RDONLY)
    try:
        receive.check_data(fd, prefix.data_at, prefix.data_len, prefix.kind, index)
    finally:
        os.close(fd)
    return SlabRow(sup, name.sub, name.slab, name.attempt, int(prefix.kind), size, header.rows,
                   prefix.data_at, prefix.data_len, header.crc_data, os.stat(path).st_mtime,
                   index_raw, stats_raw)


def reconcile_slabs(root: Path, catalog: Catalog, settings: Settings,
                    kept: Collection[tuple[str, str, int, int]] = frozenset(),
                    ) -> list[tuple[str, int, int]]:
    """Writer thread: temporary leftovers removed; a file without its row (a crash between
    rename and insert) gets its row back from its own bytes; a row without its file is
    dropped, unless ``kept`` (evicted to deep storage: its copy there serves it). Returns
    per task (slabs, bytes on disk)."""
    conn = catalog.writer
    held = rows.keys(conn)
    on_disk: set[tuple[str, str, int, int]] = set()
    for entry in os.scandir(root):
        if entry.name in layout.RESERVED or not entry.is_dir(follow_symlinks=False):
            continue
        for item in os.scandir(entry.path):
            if files.is_temporary(item.name):
                os.unlink(item.path)
                continue
            name = files.parse_name(item.name)
            if name is None:
                continue
            key = (entry.name, *name)
            if key not in held:
                try:
                    row = _file_row(Path(item.path), entry.name, name, settings)
                except (InvalidBody, OSError) as exc:
                    log.warning("removing %s: not a whole slab (%s)", item.path, exc)
                    os.unlink(item.path)
                    continue
                rows.insert(conn, row)
                log.info("%s: its catalog row was rebuilt from the file", item.path)
            on_disk.add(key)
    evicted: dict[str, int] = {}
    for key in held - on_disk:
        if key in kept:
            found = rows.get(conn, *key)
            if found is not None:
                evicted[key[0]] = evicted.get(key[0], 0) + found.size
            continue
        rows.delete(conn, *key)
        log.warning("slab %s of %s is missing: its row was dropped", key, root)
    return [(sup, count, size - evicted.get(sup, 0)) for sup, count, size in rows.figures(conn)]
