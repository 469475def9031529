"""The store: the one object the server talks to about partial segments.

It is the composition root of storage: each part below owns one idea and is handed to
those that need it through their constructors.

- :class:`~.threads.IoThreads`: blocking work off the event loop (I/O threads, a writer
  thread per location's catalog);
- :class:`~.lifecycle.book.TaskBook`: the figures of the tasks held;
- :class:`~.commit.horizon.Horizon`: generations, and the commit horizon paged readers stop at;
- :class:`~.write.inflight.Uploads`: uploads in flight per task, and the per-task lock;
- :class:`~.write.packsource.PackSource`: placement, the idle-pack pool, pack numbers;
- :class:`~.commit.committer.Committer`: written partials through the group commit (:mod:`.commit.group`)
  to visible ones, and the figures that follow;
- :class:`~.write.upload.BulkSession`: one upload request's partials (:meth:`bulk`), written to
  the packs it holds (:class:`~.write.sessionpacks.SessionPacks`);
- :class:`~.lifecycle.seals.Seals` and :class:`~.lifecycle.removal.Removal`: seals, and deleting tasks;
- :class:`~.lifecycle.verdicts.Verdicts`: the daemons a task's driver declared lost;
- :class:`~.read.reads.Reader`: lookups, partitions, pages and opening packs;
- :class:`~.slabs.service.Slabs`: slabs (one per phase-1 flush), their uploads and shard
  reads (docs/slab.md);
- :mod:`.lifecycle.startup`: locking, checking and reconciling the locations at start;
- :class:`~.deep.DeepStorage` (with ``deep_storage`` only): sealed tasks copied to an
  object-store tier in the background, reads of packs no longer local served from it.

A DELETE of a task refuses its uploads still in flight, lets commits already under way
land, then removes the task's rows and packs under the task's lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, IO, Any, TypeVar

from shuffled.config import Settings
from shuffled.errors import Conflict, InvalidBody, NotFound, ReadAgain
from shuffled.protocol import PartialKey, PartitionKey, TaskDataState
from shuffled.storage.lifecycle import startup
from shuffled.storage.write.admission import Admission, Quota
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.catalog import Catalog
from shuffled.storage.disk import Disk
from shuffled.storage.commit.group import GroupCommit
from shuffled.storage.commit.committer import Committer
from shuffled.storage.commit.horizon import Horizon
from shuffled.storage.tasks.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.placement.packsource import PackSource
from shuffled.storage.read.pageplan import SEALED_FLAG, position
from shuffled.storage.read.reads import Reader
from shuffled.storage.ondisk.records import PartialMeta, TaskEntry
from shuffled.storage.lifecycle.removal import Removal
from shuffled.storage.tasks.seals import Seals
from shuffled.storage.threads import IoThreads
from shuffled.storage.write.outcomes import PutResult, Rejected
from shuffled.storage.write.sessionpacks import INLINE_MAX, Writing
from shuffled.storage.slabs import shards as slab_shards
from shuffled.storage.slabs.service import Slabs
from shuffled.storage.slabs.shards import TaskIndex
from shuffled.storage.write.upload import BulkSession
from shuffled.storage.tasks.verdicts import Verdicts

if TYPE_CHECKING:
    from shuffled.storage.deep.peers import PeerTask
    from shuffled.storage.deep import DeepStorage
    from shuffled.storage.deep.evict import Evictor

log = logging.getLogger("shuffled.storage")
T = TypeVar("T")


class Store:
    """Partial segments across several locations, packed, indexed, rebuilt on start."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time,
                 io_threads: int = 16) -> None:
        self.settings = settings
        self.clock = clock
        self.locations = [
            Location(i, loc.path, loc.max_bytes,
                     settings.free_space_reserve if loc.reserve_bytes is None else loc.reserve_bytes)
            for i, loc in enumerate(settings.locations)
        ]
        self.catalogs = [Catalog(loc.path, settings.fsync) for loc in self.locations]
        self.disks = [Disk(loc, catalog) for loc, catalog in zip(self.locations, self.catalogs,
                                                                  strict=True)]
        self.threads = IoThreads(io_threads)
        self.commits = [
            GroupCommit(d.index, d.catalog, d.writer, fsync=settings.fsync,
                        peers=[(j, p) for j, p in enumerate(self.catalogs) if j != d.index])
            for d in self.disks]
        # Called on the loop with a supervisor task id whenever its data or state changes
        # (a commit landed, a seal, a delete): long-polling readers wait on this.
        self.listeners: list[Callable[[str], None]] = []
        self.book = TaskBook(clock)
        self.generations = Horizon()
        self.uploads = Uploads()
        self.packs = PackSource(self.locations, self.threads, settings.pack_max_bytes)
        self.committer = Committer(disks=self.disks,
                                   commits=self.commits,
                                   horizon=self.generations, book=self.book,
                                   uploads=self.uploads, packs=self.packs, notify=self._notify)
        # A failed mark outlives the readers still asking: as long as a task's data would.
        self._seals = Seals(locations=self.locations, threads=self.threads,
                            uploads=self.uploads, book=self.book, fsync=settings.fsync,
                            mark_ttl=settings.expiry_timeout)
        self.deep: DeepStorage | None = None
        if settings.deep_storage:
            from shuffled.storage.deep.service import DeepStorage as Deep  # heavy: see .deep
            self.deep = Deep(settings=settings, disks=self.disks, threads=self.threads,
                             seals=self._seals.sealed, notify=self._notify)
        self.removal = Removal(disks=self.disks,
                               threads=self.threads, book=self.book, uploads=self.uploads,
                               packs=self.packs, seals=self._seals, notify=self._notify,
                               fsync=settings.fsync, deep=self.deep)
        self.reader = Reader(self.locations, self.catalogs, self.book, self.threads,
                             deep=self.deep)
        self.admission = Admission(seals=self._seals, book=self.book,
                                   quota=Quota(settings.task_quota_bytes,
                                               settings.task_quota_partials),
                                   deleting=self.removal.deleting)
        # The driver's lost-daemon verdicts per task (memory only, bounded in bytes).
        self.verdicts = Verdicts(ttl=settings.expiry_timeout,
                                 max_bytes=settings.max_lost_marks_bytes)
        self.evictor: Evictor | None = None
        if self.deep is not None:
            from shuffled.storage.deep.evict import Evictor as Evicting
            self.evictor = Evicting(deep=self.deep, disks=self.disks, threads=self.threads,
                                    uploads=self.uploads, packs=self.packs, book=self.book,
                                    on_evicted=lambda sup: self.slabs.forget(sup),
                                    reading=lambda sup: self.slabs.being_read(sup))
        self._writing = Writing(settings=settings, locations=self.locations,
                                threads=self.threads, uploads=self.uploads, packs=self.packs,
                                committer=self.committer, admission=self.admission,
                                make_room=self.evictor.make_room if self.evictor else None)
        self.slabs = Slabs(settings=settings, disks=self.disks,
                           threads=self.threads, book=self.book, uploads=self.uploads,
                           seals=self._seals, placement=self.packs.placement,
                           deleting=self.removal.deleting, quota_of=self.admission.of,
                           notify=self._notify, clock=clock,
                           localize=self.deep.local_slabs if self.deep is not None else None)
        self.recovered_partials = 0
        self.recovered_slabs = 0
        self.dropped_on_recovery = 0

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on the store's I/O threads."""
        return await self.threads.run(fn, *args)

    async def open(self) -> None:
        """Lock every location, check its format, reconcile packs and catalog, load figures."""
        await startup.open_locations(self.disks, self.threads,
                                     self.settings.fsync)
        # A removal a crash interrupted is finished before anything is loaded or served.
        for sup in await self.removal.resume():
            self._seals.mark_deleted(sup)  # never complete while its leftovers stand
        kept = kept_slabs = None
        if self.deep is not None:  # packs and slabs evicted to the tier: rows are kept
            from shuffled.storage.deep.evict import kept as evicted
            from shuffled.storage.deep.evict import kept_slabs as evicted_slabs
            await self.deep.journal.load()
            kept = evicted(self.deep.journal.entries)
            kept_slabs = evicted_slabs(self.deep.journal.entries)
        opened = await startup.load(self.disks, self.threads, self.book,
                                    self.generations, self.packs, self._seals, kept)
        self.recovered_partials = opened.recovered
        self.recovered_slabs = await self.slabs.load(kept_slabs)
        self.dropped_on_recovery = opened.dropped
        if self.deep is not None:
            await self.deep.start(held=self.book.entries)

    async def close(self) -> None:
        if self.deep is not None:
            await self.deep.close()
        for commit in self.commits:
            await commit.idle()
        await self.packs.close()
        for disk in self.disks:
            await disk.on_writer(self.commits[disk.index].close)
            await disk.on_writer(disk.catalog.close)
            disk.location.close()
            disk.shutdown()
        self.threads.shutdown()

    def _notify(self, sup: str) -> None:
        for listener in self.listeners:
            listener(sup)

    # -- tasks ---------------------------------------------------------------------------

    def tasks(self) -> list[TaskEntry]:
        return self.book.all()

    def task(self, supervisor_task_id: str) -> TaskEntry | None:
        return self.book.get(supervisor_task_id)

    def touch(self, supervisor_task_id: str) -> None:
        """Refresh a task's last access (its expiry); a PUT or GET of its data does this."""
        self.book.touch(supervisor_task_id)

    def record_served(self, supervisor_task_id: str, nbytes: int) -> None:
        self.book.record_served(supervisor_task_id, nbytes)

    @property
    def seals(self) -> dict[str, frozenset[str]]:
        """Supervisor task -> its committed subtasks, once sealed (see :mod:`.lifecycle.seals`)."""
        return self._seals.sealed

    async def seal(self, supervisor_task_id: str, sub_task_ids: Sequence[str]) -> bool:
        """:meth:`shuffled.storage.tasks.seals.Seals.seal`; readers waiting on the task hear of it."""
        if self.removal.deleting(supervisor_task_id):
            raise Conflict(f"a DELETE of {supervisor_task_id} is not finished here: it "
                           "cannot be sealed", supervisorTaskId=supervisor_task_id)
        new = await self._seals.seal(supervisor_task_id, sub_task_ids)
        self.slabs.forget(supervisor_task_id)
        self._notify(supervisor_task_id)
        if self.deep is not None:
            # In the background; a repeated seal retries an offload that failed (a job
            # finds a complete copy of the same seal at once and ends).
            self.deep.offload(supervisor_task_id)
        return new

    async def fail(self, supervisor_task_id: str) -> bool:
        """Its supervisor's fail verdict, durable (:meth:`shuffled.storage.tasks.seals.Seals.fail`): paged reads
        of the task answer empty and never complete, its uploads and seals are refused
        (:mod:`.write.admission`), until it is deleted; its waiters hear of it. True if new."""
        new = await self._seals.fail(supervisor_task_id)
        self.slabs.forget(supervisor_task_id)
        self._notify(supervisor_task_id)
        return new

    def mark_deleted(self, supervisor_task_id: str) -> None:
        """Its DELETE has begun: paged reads answer "failed" (for a while, in memory) and
        it cannot be sealed; its waiters hear of it."""
        self._seals.mark_deleted(supervisor_task_id)
        self._notify(supervisor_task_id)

    def failed(self, supervisor_task_id: str) -> bool:
        return self._seals.failed(supervisor_task_id)

    def state(self, supervisor_task_id: str) -> TaskDataState:
        """What a reader may conclude of the task: failed, sealed, running or none."""
        if self.failed(supervisor_task_id):
            return TaskDataState.FAILED
        if supervisor_task_id in self.seals:
            return TaskDataState.SEALED
        return TaskDataState.RUNNING if self.task(supervisor_task_id) else TaskDataState.NONE

    def view(self, key: PartitionKey, sub_task_ids: Sequence[str] | None, token: int,
             ) -> tuple[list[PartialMeta], bool, bool]:
        """The partials a paged read from ``token`` walks: held, of the sealed subtasks once
        sealed, of the named ones if named, in commit order, and below the commit horizon:
        a partial is served only once every partial with a lower generation has landed or
        failed, so a token never steps past one that becomes visible later. Also says
        whether the horizon held any back (then the partition cannot read as complete yet)
        and whether the task is sealed (then the tokens handed out carry SEALED_FLAG).

        Raises ReadAgain (409) for a token handed out before the seal that has passed a
        partial of a subtask the seal leaves out: that reader was served bytes that are not
        the committed data."""
        sup = key.supervisor_task_id
        try:
            metas = self.reader.partition(key)
        except NotFound:
            metas = []
        horizon = self.generations.horizon
        held_back = False
        if horizon is not None:
            below = [m for m in metas if m.generation < horizon]
            held_back = len(below) < len(metas)
            metas = below
        if sub_task_ids is not None:
            named = set(sub_task_ids)
            metas = [m for m in metas if m.key.sub_task_id in named]
        sealed = self.seals.get(sup)
        if sealed is not None:
            if token and not token & SEALED_FLAG:
                at = position(token)
                passed = [m for m in metas if m.key.sub_task_id not in sealed
                          and (m.generation, 0) < at]
                if passed:
                    raise ReadAgain(
                        f"this reader was served partials of subtask {passed[0].key.sub_task_id}"
                        f" of {sup}, which the seal leaves out: discard the pages read and "
                        "read again from token 0", supervisorTaskId=sup, token=0)
            metas = [m for m in metas if m.key.sub_task_id in sealed]
        return sorted(metas, key=lambda m: m.generation), held_back, sealed is not None

    # -- writes --------------------------------------------------------------------------

    def bulk(self, supervisor_task_id: str) -> BulkSession:
        """A session writing many partial segments of one task (see :class:`BulkSession`)."""
        return BulkSession(supervisor_task_id, self._writing)

    async def put(self, key: PartialKey, body: AsyncIterator[bytes], content_length: int | None,
                  expected_crc: int | None) -> PutResult:
        """Stream ``body`` into a new generation of ``key``; visible only once durable.

        Raises TooLarge, InsufficientStorage, InvalidBody, DigestMismatch, Conflict (task
        deleted meanwhile) or LocationFailed; whatever it raises, nothing is left on disk.
        """
        async with self.bulk(key.supervisor_task_id) as session:
            if content_length is not None and content_length <= INLINE_MAX:
                # Read whole only up to INLINE_MAX (larger bodies stream to the pack: many
                # concurrent ~1 MiB bodies held whole cost the daemon tens of MiB of heap),
                # into one buffer of the announced size filled in place (a bytearray grown
                # chunk by chunk leaves a trail of freed sizes in the allocator's arenas).
                data = bytearray(content_length)
                view, at = memoryview(data), 0
                async for chunk in body:
                    if at + len(chunk) > content_length:
                        raise InvalidBody(f"body has more than the {content_length} bytes "
                                          f"announced")
                    view[at: at + len(chunk)] = chunk
                    at += len(chunk)
                await session.add(key, view[:at], content_length, expected_crc)
            else:
                await session.add(key, body, content_length, expected_crc)
            (result,) = await session.finish()
        if isinstance(result, Rejected):
            raise result.error
        return result

    async def delete_task(self, supervisor_task_id: str, *, if_accesses: int | None = None,
                          everyone: bool = False) -> TaskEntry | None:
        """:meth:`shuffled.storage.lifecycle.removal.Removal.delete_task`."""
        self.slabs.forget(supervisor_task_id)
        return await self.removal.delete_task(supervisor_task_id, if_accesses=if_accesses,
                                              everyone=everyone)

    async def remove_leftovers(self) -> list[str]:
        """:meth:`shuffled.storage.lifecycle.removal.Removal.remove_leftovers`."""
        return await self.removal.remove_leftovers()

    async def probe_unhealthy(self) -> list[Location]:
        """Probe unhealthy locations; return those that came back into service."""
        return await self.packs.probe([loc for loc in self.locations if not loc.healthy])

    # -- reads ---------------------------------------------------------------------------

    def lookup(self, key: PartialKey) -> PartialMeta:
        return self.reader.lookup(key)

    def partition(self, key: PartitionKey, sub_task_ids: Sequence[str] | None = None,
                  ) -> list[PartialMeta]:
        """The partial segments of one partition, by subtask id; all must exist if named."""
        return self.reader.partition(key, sub_task_ids)

    def partitions(self, supervisor_task_id: str,
                   wanted: Sequence[tuple[PartitionKey, Sequence[str] | None]],
                   ) -> list[list[PartialMeta]]:
        """:meth:`partition` of many partitions of one task (a bulk read), batched."""
        return self.reader.partitions(supervisor_task_id, wanted)

    def page(self, supervisor_task_id: str, cursor: str | None, limit: int,
             ) -> tuple[list[PartialMeta], str | None]:
        return self.reader.page(supervisor_task_id, cursor, limit)

    async def open_partial(self, key: PartialKey) -> tuple[PartialMeta, IO[bytes]]:
        """The newest generation of ``key`` and its pack, open.

        If the task is deleted between lookup and open, look again: a reader gets the old
        or the new bytes complete, or NotFound, never a mix (packs are append-only).
        """
        return await self.reader.open_partial(key)

    async def localize(self, metas: Sequence[PartialMeta], *, missing: bool = False) -> bool:
        """:meth:`shuffled.storage.read.reads.Reader.localize`: packs no longer local read back from deep
        storage."""
        return await self.reader.localize(metas, missing=missing)

    def offload_state(self, supervisor_task_id: str) -> dict[str, str] | None:
        """:meth:`.deep.DeepStorage.offload_state`; None without deep storage."""
        return None if self.deep is None else self.deep.offload_state(supervisor_task_id)

    async def peer(self, supervisor_task_id: str, instance: str) -> PeerTask:
        """The share of a task the daemon ``instance`` offloaded, served from deep storage
        (:mod:`.deep.peers`); NotFound without deep storage or a complete copy there."""
        if self.deep is None:
            raise NotFound(f"this daemon has no deep storage to read {instance}'s share of "
                           f"{supervisor_task_id} from", supervisorTaskId=supervisor_task_id)
        return await self.deep.peer(supervisor_task_id, instance)

    async def peer_shard_index(self, supervisor_task_id: str, instance: str,
                               without: frozenset[str] = frozenset()) -> TaskIndex:
        """The shard index over the slabs the daemon ``instance`` offloaded (of its sealed
        subtasks but ``without``), read back from deep storage (:mod:`.deep.peers`); kept
        on the peer's share for the next reads that leave out the same subtasks."""
        peer = await self.peer(supervisor_task_id, instance)
        held = peer.slab_index
        if held is not None and held[0] == without:
            index: TaskIndex = held[1]
            return index
        found = await peer.slab_files(without)
        index = await self.threads.run(slab_shards.build, found)
        peer.slab_index = (without, index)
        return index

    async def open_many(self, metas: Sequence[PartialMeta]) -> list[IO[bytes]]:
        """Open the packs of ``metas`` (each once) up front; one file object per meta."""
        return await self.reader.open_many(metas)
