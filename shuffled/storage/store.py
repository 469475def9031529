"""The store: the one object the server talks to about partial segments.

All blocking file work runs on the store's thread pool; the event loop only does
bookkeeping. Mutations of one supervisor task (commit, delete) are serialised by a per-task
lock, so a DELETE and a late upload of the same task never interleave on disk.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from shuffled.config import Settings
from shuffled.errors import Conflict, InsufficientStorage, InvalidBody, NotFound, TooLarge
from shuffled.protocol import PartialKey, PartitionKey
from shuffled.storage import recovery, writer
from shuffled.storage.index import PartialMeta, TaskEntry
from shuffled.storage.location import Location
from shuffled.storage.oserrors import marks_unhealthy, translate
from shuffled.storage.placement import RoundRobin

log = logging.getLogger("shuffled.storage")
T = TypeVar("T")

WRITE_BATCH = 1 << 20  # bytes gathered before one executor hop writes them
RESERVE_STEP = 8 << 20  # reservation growth for uploads without Content-Length


@dataclass(slots=True, eq=False)
class _Upload:
    key: PartialKey
    cancelled: bool = False


@dataclass(slots=True)
class PutResult:
    meta: PartialMeta
    replaced: bool


def _remove_tree(path: Any) -> None:
    """``rm -r path``: an absent tree is fine, any other failure is raised."""

    def onerror(func: Any, name: str, exc_info: Any) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(path, onerror=onerror)


class Store:
    """Partial segments across several locations, indexed in memory, rebuilt on start."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time,
                 io_threads: int = 16) -> None:
        self.settings = settings
        self.clock = clock
        self.locations = [
            Location(i, loc.path, loc.max_bytes,
                     settings.free_space_reserve if loc.reserve_bytes is None else loc.reserve_bytes)
            for i, loc in enumerate(settings.locations)
        ]
        self._placement = RoundRobin(self.locations)
        self._tasks: dict[str, TaskEntry] = {}
        self._inflight: dict[str, set[_Upload]] = {}
        # Supervisor tasks a DELETE could not fully remove -> indexes of those locations.
        self._leftovers: dict[str, set[int]] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="shuffled-io")
        self._last_generation = 0
        self.recovered_partials = 0
        self.dropped_on_recovery = 0

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on the store's I/O threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        """Lock every location, clear temp files and rebuild the index from disk."""
        opened: list[Location] = []
        try:
            for loc in self.locations:
                await self.run(loc.open)
                opened.append(loc)
        except BaseException:
            for loc in opened:
                loc.close()
            raise
        # The rebuild allocates a few objects per partial and frees none: the cyclic
        # collector would walk the growing index again and again (superlinear in the number
        # of partials). Pause it, then freeze the index out of later collections.
        collecting = gc.isenabled()
        gc.disable()
        try:
            found: list[PartialMeta] = []
            for loc in self.locations:
                result = await self.run(recovery.scan, loc)
                found.extend(result.partials)
                self.dropped_on_recovery += result.dropped
            keep, stale = recovery.newest_only(found)
            for meta in stale:
                await self.run(writer.remove, meta)
            now = self.clock()
            for meta in keep:
                self._index(meta, now)
                self._last_generation = max(self._last_generation, meta.generation)
        finally:
            if collecting:
                gc.freeze()
                gc.enable()
        self.recovered_partials = len(keep)
        if keep or stale:
            log.info("recovered %d partial segments of %d tasks (%d stale dropped)",
                     len(keep), len(self._tasks), len(stale) + self.dropped_on_recovery)

    async def close(self) -> None:
        for loc in self.locations:
            loc.close()
        self._executor.shutdown(wait=True, cancel_futures=False)

    # -- index bookkeeping (event loop only) ---------------------------------------------

    def _lock(self, supervisor_task_id: str) -> asyncio.Lock:
        lock = self._locks.get(supervisor_task_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[supervisor_task_id] = lock
        return lock

    def _index(self, meta: PartialMeta, now: float) -> PartialMeta | None:
        sup = meta.key.supervisor_task_id
        entry = self._tasks.get(sup)
        if entry is None:
            entry = self._tasks[sup] = TaskEntry(sup, last_access=now)
        old = entry.add(meta)
        loc = self.locations[meta.location]
        loc.used_bytes += meta.size
        loc.files += 1
        if old is not None:
            self._unaccount(old)
        return old

    def _unaccount(self, meta: PartialMeta) -> None:
        loc = self.locations[meta.location]
        loc.used_bytes -= meta.size
        loc.files -= 1

    def _next_generation(self) -> int:
        self._last_generation = max(time.time_ns(), self._last_generation + 1)
        return self._last_generation

    def touch(self, supervisor_task_id: str) -> None:
        """Refresh a task's last access (its expiry); a PUT or GET of its data does this."""
        entry = self._tasks.get(supervisor_task_id)
        if entry is not None:
            entry.last_access = self.clock()
            entry.accesses += 1

    # -- queries -------------------------------------------------------------------------

    def tasks(self) -> list[TaskEntry]:
        return list(self._tasks.values())

    def task(self, supervisor_task_id: str) -> TaskEntry | None:
        return self._tasks.get(supervisor_task_id)

    def lookup(self, key: PartialKey) -> PartialMeta:
        entry = self._tasks.get(key.supervisor_task_id)
        meta = entry.get(key) if entry else None
        if meta is None:
            raise NotFound(f"no partial segment {key}", key=str(key))
        return meta

    def partition(self, key: PartitionKey, sub_task_ids: Sequence[str] | None = None,
                  ) -> list[PartialMeta]:
        """The partial segments of one partition, by subtask id; all must exist if named."""
        entry = self._tasks.get(key.supervisor_task_id)
        subs = entry.partitions.get((key.interval, key.partition_id), {}) if entry else {}
        if sub_task_ids is None:
            if not subs:
                raise NotFound(
                    f"no partial segments of {key.supervisor_task_id} {key.interval} "
                    f"partition {key.partition_id}", partition=key.partition_id,
                )
            return [subs[s] for s in sorted(subs)]
        missing = [s for s in sub_task_ids if s not in subs]
        if missing:
            raise NotFound(
                f"{key.supervisor_task_id} {key.interval} partition {key.partition_id} has "
                f"no partial segment from subtasks {missing[:20]}", missing=missing[:100],
            )
        return [subs[s] for s in dict.fromkeys(sub_task_ids)]

    async def open_partial(self, key: PartialKey) -> tuple[PartialMeta, IO[bytes]]:
        """The newest generation of ``key`` and an open file of it.

        If the key is replaced or deleted between lookup and open, look again: a reader
        gets the old or the new file complete, or NotFound, never a mix.
        """
        for _ in range(5):
            meta = self.lookup(key)
            try:
                return meta, await self.run(open, meta.path, "rb")
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise translate(exc, str(self.locations[meta.location].path), "opening") from exc
        raise NotFound(f"no partial segment {key}", key=str(key))

    async def open_many(self, metas: Sequence[PartialMeta]) -> list[IO[bytes]]:
        """Open every file of ``metas`` up front so a later replace cannot break a response."""
        def _open_all() -> list[IO[bytes]]:
            files: list[IO[bytes]] = []
            try:
                for meta in metas:
                    # Unbuffered: reads are positional (pread/sendfile); a BufferedReader per
                    # file would allocate 8 KiB each for nothing, 8 MiB for 1,000 partials.
                    files.append(open(meta.path, "rb", buffering=0))
            except BaseException:
                for fh in files:
                    fh.close()
                raise
            return files
        try:
            return await self.run(_open_all)
        except FileNotFoundError as exc:
            raise Conflict("a partial segment of this partition was replaced or deleted "
                           "while the request started; retry") from exc
        except OSError as exc:
            raise translate(exc, "a location", "opening") from exc

    def record_served(self, supervisor_task_id: str, nbytes: int) -> None:
        entry = self._tasks.get(supervisor_task_id)
        if entry is not None:
            entry.served_bytes += nbytes
            entry.served_requests += 1

    # -- writes --------------------------------------------------------------------------

    async def _start_temp(self, size: int) -> tuple[Location, writer.TempPartial]:
        tried: set[int] = set()
        while True:
            loc = self._placement.choose(size, frozenset(tried))
            try:
                return loc, await self.run(writer.TempPartial, loc, size, self.settings.fsync)
            except InsufficientStorage:
                tried.add(loc.index)
            except OSError as exc:
                tried.add(loc.index)
                if marks_unhealthy(exc):
                    loc.mark_unhealthy(f"{exc.strerror} creating a temp file")
                    log.error("location %s taken out of service: %s", loc.path, exc)

    async def put(self, key: PartialKey, body: AsyncIterator[bytes], content_length: int | None,
                  expected_crc: int | None) -> PutResult:
        """Stream ``body`` into a new generation of ``key``; visible only once complete.

        Raises TooLarge, InsufficientStorage, InvalidBody, DigestMismatch, Conflict (task
        deleted meanwhile) or LocationFailed; whatever it raises, nothing is left on disk.
        """
        limit = self.settings.max_partial_bytes
        if content_length is not None and content_length > limit:
            raise TooLarge(f"partial segment of {content_length} bytes exceeds the limit of "
                           f"{limit} bytes (max_partial_bytes)", limit=limit)
        upload = _Upload(key)
        sup = key.supervisor_task_id
        self._inflight.setdefault(sup, set()).add(upload)
        reserved = content_length or 0
        tmp: writer.TempPartial | None = None
        loc: Location | None = None
        committed = False
        try:
            loc, tmp = await self._start_temp(reserved)
            loc.reserved_bytes += reserved
            pending: list[bytes] = []
            pending_size = size = 0
            async for chunk in body:
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"partial segment exceeds the limit of {limit} bytes "
                                   f"(max_partial_bytes)", limit=limit)
                if size > reserved:
                    grow = max(RESERVE_STEP, size - reserved)
                    if not loc.has_room(grow):
                        raise InsufficientStorage(f"location {loc.path} is full (max size)",
                                                  location=str(loc.path))
                    loc.reserved_bytes += grow
                    reserved += grow
                pending.append(chunk)
                pending_size += len(chunk)
                if pending_size >= WRITE_BATCH:
                    await self.run(_write_all, tmp, pending)
                    pending, pending_size = [], 0
            if pending:
                await self.run(_write_all, tmp, pending)
            if content_length is not None and size != content_length:
                raise InvalidBody(f"body has {size} bytes but Content-Length said {content_length}")
            written = await self.run(tmp.finish, expected_crc)
            async with self._lock(sup):
                if upload.cancelled:
                    raise Conflict(f"supervisor task {sup} was deleted while this upload was "
                                   f"in flight; nothing was stored", supervisorTaskId=sup)
                meta = await self.run(writer.commit, written, loc, key,
                                      self._next_generation(), self.settings.fsync)
                committed = True
                old = self._index(meta, self.clock())
                entry = self._tasks[sup]
                entry.received_bytes += meta.size
                entry.received_partials += 1
                entry.last_access = self.clock()
                entry.accesses += 1
            if old is not None:
                await self.run(writer.remove, old)
            return PutResult(meta, old is not None)
        except OSError as exc:
            where = str(loc.path) if loc else "?"
            if loc is not None and marks_unhealthy(exc):
                loc.mark_unhealthy(f"{exc.strerror} while writing")
                log.error("location %s taken out of service: %s", where, exc)
            raise translate(exc, where, f"writing {key}") from exc
        finally:
            if loc is not None:
                loc.reserved_bytes -= reserved
            if tmp is not None and not committed:
                await _discard(self, tmp)
            inflight = self._inflight.get(sup)
            if inflight is not None:
                inflight.discard(upload)
                if not inflight:
                    del self._inflight[sup]

    async def delete_task(self, supervisor_task_id: str, *,
                          if_accesses: int | None = None) -> TaskEntry | None:
        """Remove everything of a supervisor task; idempotent. In-flight uploads of it are
        refused at commit. Returns what was removed (None if nothing was held).

        With ``if_accesses`` (the sweeper's case) nothing happens unless the task's access
        count still equals it once the task's lock is held: a PUT that committed while the
        sweeper waited for the lock saves the task.
        """
        sup = supervisor_task_id
        async with self._lock(sup):
            current = self._tasks.get(sup)
            if if_accesses is not None and (current is None or current.accesses != if_accesses):
                return None
            for upload in self._inflight.get(sup, ()):
                upload.cancelled = True
            entry = self._tasks.pop(sup, None)
            if entry is not None:
                for meta in entry.all():
                    self._unaccount(meta)
            failed: tuple[Location, OSError] | None = None
            for loc in self.locations:
                try:
                    await self.run(_remove_tree, loc.path / sup)
                except OSError as exc:  # keep going: remove what can be removed everywhere
                    failed = failed or (loc, exc)
                    self._leftovers.setdefault(sup, set()).add(loc.index)
                    if marks_unhealthy(exc):
                        loc.mark_unhealthy(f"{exc.strerror} while deleting")
            if failed is not None:
                # Say so rather than answer success: left alone, the files would be indexed
                # again at the next start. remove_leftovers() finishes the job once the disk
                # recovers (each sweep), as does a retried DELETE.
                loc, exc = failed
                log.error("could not delete all of %s on %s: %s", sup, loc.path, exc)
                raise translate(exc, str(loc.path), f"deleting supervisor task {sup}")
            self._leftovers.pop(sup, None)
        return entry

    async def remove_leftovers(self) -> list[str]:
        """Retry removing what failed DELETEs left on locations now healthy; returns the
        supervisor tasks fully removed. A task written again since is live data: skipped."""
        done = []
        for sup in list(self._leftovers):
            async with self._lock(sup):
                where = self._leftovers.get(sup, set())
                if sup in self._tasks:
                    self._leftovers.pop(sup, None)
                    continue
                for i in sorted(where):
                    loc = self.locations[i]
                    if not loc.healthy:
                        continue
                    try:
                        await self.run(_remove_tree, loc.path / sup)
                    except OSError as exc:
                        log.warning("still cannot remove %s on %s: %s", sup, loc.path, exc)
                        continue
                    where.discard(i)
                if not where:
                    self._leftovers.pop(sup, None)
                    done.append(sup)
        return done

    async def probe_unhealthy(self) -> list[Location]:
        """Probe unhealthy locations; return those that came back into service."""
        back = []
        for loc in self.locations:
            if loc.healthy:
                continue
            try:
                await self.run(loc.probe)
            except OSError as exc:
                loc.last_error = f"probe failed: {exc.strerror}"
                continue
            loc.mark_healthy()
            back.append(loc)
            log.warning("location %s is back in service", loc.path)
        return back


def _write_all(tmp: writer.TempPartial, chunks: list[bytes]) -> None:
    for chunk in chunks:
        tmp.write(chunk)


async def _discard(store: Store, tmp: writer.TempPartial) -> None:
    # Shielded so a cancelled handler still removes its temp file.
    try:
        await asyncio.shield(store.run(tmp.discard))
    except asyncio.CancelledError:
        tmp.discard()
        raise
