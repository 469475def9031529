"""The store: the one object the server talks to about partial segments.

Partial segments live in packs (:mod:`.packs`) indexed by one SQLite catalog per location
(:mod:`.catalog`); uploads go through sessions (:mod:`.session`) and become visible through
the location's group commit (:mod:`.commit`). Blocking file work runs on the store's I/O
threads, catalog writes on one writer thread per location; the event loop keeps only
per-task figures. A DELETE of a task refuses its uploads still in flight, lets commits
already under way land, then removes the task's rows and packs under the task's lock.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import shutil
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from shuffled.config import Settings
from shuffled.errors import Conflict, InsufficientStorage, InvalidBody, ShuffleError
from shuffled.protocol import PartialKey
from shuffled.storage import packs, recovery, seals
from shuffled.storage.append import Written
from shuffled.storage.catalog import Catalog, Row
from shuffled.storage.commit import GroupCommit, Landed
from shuffled.storage.index import PartialMeta, TaskEntry
from shuffled.storage.location import Location
from shuffled.storage.oserrors import marks_unhealthy, translate
from shuffled.storage.placement import RoundRobin
from shuffled.storage.queries import Queries
from shuffled.storage.session import INLINE_MAX, BulkSession, PutResult

log = logging.getLogger("shuffled.storage")
T = TypeVar("T")


@dataclass(slots=True)
class _Writes:
    """Uploads of one supervisor task in flight: sessions open, commits not yet landed."""

    sessions: set[BulkSession] = field(default_factory=set)
    committing: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


def _remove_tree(path: Any) -> None:
    """``rm -r path``: an absent tree is fine, any other failure is raised."""

    def onerror(func: Any, name: str, exc_info: Any) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(path, onerror=onerror)


class Store(Queries):
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
        self._writers = [ThreadPoolExecutor(1, thread_name_prefix=f"shuffled-commit-{i}")
                         for i in range(len(self.locations))]
        self.commits = [
            GroupCommit(i, c, w, settings.fsync,
                        [(j, p) for j, p in enumerate(self.catalogs) if j != i])
            for i, (c, w) in enumerate(zip(self.catalogs, self._writers, strict=True))]
        self._placement = RoundRobin(self.locations)
        self._pool = packs.PackPool(settings.pack_max_bytes)
        self._tasks: dict[str, TaskEntry] = {}
        self._writes: dict[str, _Writes] = {}
        # Supervisor tasks a DELETE could not fully remove -> indexes of those locations.
        self._leftovers: dict[str, set[int]] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="shuffled-io")
        self._background: set[asyncio.Future[Any]] = set()
        self._last_generation = 0
        self._last_pack = 0
        self.recovered_partials = 0
        self.dropped_on_recovery = 0
        # Generations handed to partials whose group commit has not landed yet. Commits of
        # two locations land in any order, so a partial with a lower generation can become
        # visible after a higher one: readers in commit order stop below these (horizon).
        self._in_flight: set[int] = set()
        # The same generations as a min-heap: the horizon is its top once landed ones are
        # dropped from it (amortised O(log n) per generation, not a min() per page read).
        self._in_flight_heap: list[int] = []
        # Supervisor task -> its committed subtasks, once sealed (see :mod:`.seals`).
        self.seals: dict[str, frozenset[str]] = {}
        # Called on the loop with a supervisor task id whenever its data or state changes
        # (a commit landed, a seal, a delete): long-polling readers wait on this.
        self.listeners: list[Callable[[str], None]] = []

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on the store's I/O threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def on_writer(self, index: int, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on location ``index``'s writer thread (catalog writes)."""
        return await asyncio.get_running_loop().run_in_executor(self._writers[index], fn, *args)

    async def open(self) -> None:
        """Lock every location, check its format, reconcile packs and catalog, load figures."""
        opened: list[Location] = []
        try:
            for loc in self.locations:
                await self.run(loc.open)
                opened.append(loc)
                await self.run(recovery.check_format, loc.path, self.settings.fsync)
                await self.on_writer(loc.index, self.catalogs[loc.index].open)
        except BaseException:
            for loc in opened:
                loc.close()
                await self.on_writer(loc.index, self.catalogs[loc.index].close)
            raise
        now = self.clock()
        found_at = [await self.on_writer(loc.index, recovery.reconcile, loc.path, catalog)
                    for loc, catalog in zip(self.locations, self.catalogs, strict=True)]
        for index in await self._forget_shadowed():
            # A forgotten copy may have been its pack's only or last partial: settle that
            # location's packs again, or the pack stays on disk with nothing referring to it.
            loc = self.locations[index]
            again = await self.on_writer(index, recovery.reconcile, loc.path,
                                         self.catalogs[index])
            first = found_at[index]
            again.dropped += first.dropped
            again.cut_bytes += first.cut_bytes
            again.orphans += first.orphans
            again.max_pack = max(again.max_pack, first.max_pack)
            found_at[index] = again
        for loc, catalog, found in zip(self.locations, self.catalogs, found_at, strict=True):
            self.dropped_on_recovery += found.dropped
            self._last_pack = max(self._last_pack, found.max_pack)
            for sup, count, size, newest in await self.on_writer(loc.index, catalog.task_figures):
                entry = self._tasks.get(sup) or self._tasks.setdefault(sup, TaskEntry(sup, now))
                entry.files += count
                entry.bytes += size
                entry.files_at[loc.index] = count
                loc.files += count
                self._last_generation = max(self._last_generation, newest)
                self.recovered_partials += count
            for sup, length in found.pack_bytes.items():
                if sup in self._tasks:
                    self._tasks[sup].pack_bytes[loc.index] = length
                loc.used_bytes += length
            for sup, keys in (await self.on_writer(loc.index, catalog.slot_keys)).items():
                entry = self._tasks[sup]
                entry.slots = keys if not entry.slots else entry.slots | keys
        for loc in self.locations:
            for sup, subs in (await self.run(seals.read_seals, loc.path)).items():
                # Seals only grow: a location that missed an extension has a subset.
                self.seals[sup] = self.seals.get(sup, frozenset()) | subs
                self._tasks.setdefault(sup, TaskEntry(sup, now))
        if self.recovered_partials or self.dropped_on_recovery:
            log.info("recovered %d partial segments of %d tasks (%d dropped)",
                     self.recovered_partials, len(self._tasks), self.dropped_on_recovery)

    async def _forget_shadowed(self) -> list[int]:
        """Forget older copies of keys another location holds newer (left by a crash
        between a cross-location replace and its background forget), so that figures
        count every key once. One join per pair of locations, on the writer threads.
        Returns the indexes of the locations where rows were forgotten."""
        stale: dict[int, list[tuple[Any, ...]]] = {}
        for i, catalog in enumerate(self.catalogs):
            for j in range(i + 1, len(self.catalogs)):
                other = self.catalogs[j].path
                for row, there in await self.on_writer(i, catalog.shared_keys, other):
                    if there > row[5]:
                        stale.setdefault(i, []).append(row)
                    else:
                        stale.setdefault(j, []).append((*row[:5], there))
        for index, rows in stale.items():
            await self.on_writer(index, self.catalogs[index].forget_many, rows)
            self.dropped_on_recovery += len(rows)
            log.warning("forgot %d older copies in %s of partials another location holds",
                        len(rows), self.locations[index].path)
        return sorted(stale)

    async def close(self) -> None:
        for commit in self.commits:
            await commit.idle()
        for pack in self._pool.all():
            pack.close()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        for loc, catalog in zip(self.locations, self.catalogs, strict=True):
            await self.on_writer(loc.index, self.commits[loc.index].close)
            await self.on_writer(loc.index, catalog.close)
            loc.close()
        for writer in self._writers:
            writer.shutdown(wait=True)
        self._executor.shutdown(wait=True, cancel_futures=False)

    # -- bookkeeping (event loop only) ---------------------------------------------------

    def _lock(self, supervisor_task_id: str) -> asyncio.Lock:
        lock = self._locks.get(supervisor_task_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[supervisor_task_id] = lock
        return lock

    def _next_generation(self) -> int:
        self._last_generation = max(time.time_ns(), self._last_generation + 1)
        return self._last_generation

    def _sessions(self, sup: str) -> set[BulkSession]:
        writes = self._writes.get(sup)
        if writes is None:
            writes = self._writes[sup] = _Writes()
            writes.idle.set()
        return writes.sessions

    def _forget_writes(self, sup: str) -> None:
        writes = self._writes.get(sup)
        if writes is not None and not writes.sessions and not writes.committing:
            del self._writes[sup]

    async def _wait_for_delete(self, sup: str) -> None:
        lock = self._locks.get(sup)
        if lock is not None and lock.locked():
            async with lock:
                pass

    def _take_out(self, loc: Location, reason: str) -> None:
        if loc.healthy:
            log.error("location %s taken out of service: %s", loc.path, reason)
        loc.mark_unhealthy(reason)
        for pack in self._pool.drop_location(loc.index):
            self._close_later(pack)

    def _close_later(self, pack: packs.Pack) -> None:
        future = asyncio.ensure_future(self.run(pack.close))
        self._background.add(future)
        future.add_done_callback(self._background.discard)

    def _new_pack_number(self) -> int:
        self._last_pack += 1
        return self._last_pack

    async def _release(self, pack: packs.Pack) -> None:
        """Give ``pack`` back to the pool, or close it (and remove it if it never held a
        committed partial: a refused upload leaves no file behind)."""
        if pack.fresh or pack.dead:
            pack.dead = True
            await asyncio.shield(self.run(_close_pack, pack))
            return
        extra = self._pool.give(pack)
        if extra is not None:
            self._close_later(extra)

    def _commit(self, loc: Location, written: Sequence[tuple[PartialKey, Written]],
                ) -> tuple[list[PartialMeta], asyncio.Future[list[int | None]]]:
        """Submit partials written to one pack to the location's group commit; the future
        gives, per partial, the size of the one it replaced (None if new) once durable."""
        metas = []
        for key, w in written:
            facts = w.facts
            metas.append(PartialMeta(
                key=key, generation=self._next_generation(), location=loc.index,
                path=w.pack.path, offset=w.offset, size=w.size, rows=facts.rows, crc=w.crc,
                schema_len=facts.schema_len, schema_crc=facts.schema_crc,
                body_crc=facts.body_crc, has_dictionaries=facts.has_dictionaries,
                created=time.time(), pack=w.pack.number))
        sup = metas[0].key.supervisor_task_id
        self.hold([m.generation for m in metas])
        self._sessions(sup)
        writes = self._writes[sup]
        writes.committing += 1
        writes.idle.clear()
        # An older copy can only be elsewhere if this task already has the partition.
        entry = self._tasks.get(sup)
        several = len(self.locations) > 1 and entry is not None
        look = [several and m.slot_key in entry.slots for m in metas]  # type: ignore[union-attr]
        landed = self.commits[loc.index].submit(metas, written[0][1].pack, look)
        outcome: asyncio.Future[list[int | None]] = asyncio.get_running_loop().create_future()
        landed.add_done_callback(lambda f: self._committed(sup, metas, f, outcome))
        return metas, outcome

    def _committed(self, sup: str, metas: list[PartialMeta],
                   future: asyncio.Future[list[Landed]],
                   outcome: asyncio.Future[list[int | None]]) -> None:
        """A group landed (or failed): update the task's figures, then resolve ``outcome``
        with the size each partial replaced, wherever it was. Runs on the loop."""
        self.land([m.generation for m in metas])
        writes = self._writes[sup]
        writes.committing -= 1
        if not writes.committing:
            writes.idle.set()
            self._forget_writes(sup)
        if future.cancelled():
            outcome.cancel()
            return
        if future.exception() is not None:
            outcome.set_exception(future.exception())  # type: ignore[arg-type]
            return
        entry = self._tasks.get(sup)
        if entry is None:
            entry = self._tasks[sup] = TaskEntry(sup, last_access=self.clock())
        olds: list[int | None] = []
        for meta, landed in zip(metas, future.result(), strict=True):
            index = meta.location
            loc = self.locations[index]
            old = landed.old
            entry.pack_bytes[index] = entry.pack_bytes.get(index, 0) + meta.size
            loc.used_bytes += meta.size
            if old is None:
                if landed.elsewhere is not None:
                    old = self._forget(entry, *landed.elsewhere)
                entry.files_at[index] = entry.files_at.get(index, 0) + 1
                loc.files += 1
            entry.files += old is None
            entry.bytes += meta.size - (old or 0)
            entry.slots.add(meta.slot_key)
            entry.received_bytes += meta.size
            entry.received_partials += 1
            olds.append(old)
        entry.last_access = self.clock()
        entry.accesses += 1
        outcome.set_result(olds)
        self._notify(sup)

    @property
    def horizon(self) -> int | None:
        """The lowest generation still being committed (None: none is): every partial below
        it that will ever be visible already is."""
        heap = self._in_flight_heap
        return heap[0] if heap else None  # land() keeps a landed generation off the top

    def hold(self, generations: Sequence[int]) -> None:
        """Generations handed out whose commit has not landed: readers stop below them."""
        self._in_flight.update(generations)
        for g in generations:
            heapq.heappush(self._in_flight_heap, g)

    def land(self, generations: Sequence[int]) -> None:
        """Those generations' commit landed (or failed): they no longer hold readers back."""
        self._in_flight.difference_update(generations)
        heap = self._in_flight_heap
        while heap and heap[0] not in self._in_flight:
            heapq.heappop(heap)  # pruned here too, so the heap holds about what is in flight

    def _notify(self, sup: str) -> None:
        for listener in self.listeners:
            listener(sup)

    async def seal(self, supervisor_task_id: str, sub_task_ids: Sequence[str]) -> bool:
        """Record that exactly ``sub_task_ids`` of the task are committed, durably on every
        healthy location. True if new, False if the same seal was already there (a retry);
        a seal that adds subtasks to the known one extends it (a supervisor that recomputed
        lost subtasks seals their replacements, docs/failover.md); any other different one
        is a Conflict: a committed subtask is never taken back. A task not held yet is held
        from now on (empty), so that expiry and DELETE remove its seal like any data."""
        sup = supervisor_task_id
        subs = frozenset(sub_task_ids)
        async with self._lock(sup):
            known = self.seals.get(sup)
            if known is not None:
                if not known <= subs:
                    raise Conflict(f"{sup} is already sealed with {len(known - subs)} "
                                   "subtasks this seal leaves out; a seal may only add "
                                   "subtasks", sealed=sorted(known)[:100])
                if known == subs:
                    return False
            written = 0
            failure: OSError | None = None
            for loc in self.locations:
                if not loc.healthy:
                    continue
                try:
                    await self.run(seals.write_seal, loc.path, sup, subs, self.settings.fsync)
                    written += 1
                except OSError as exc:
                    failure = failure or exc
            if not written:
                raise translate(failure or OSError("no healthy location"), "locations",
                                f"sealing supervisor task {sup}")
            self.seals[sup] = subs
            self._tasks.setdefault(sup, TaskEntry(sup, last_access=self.clock()))
            self.touch(sup)
        self._notify(sup)
        return True

    def _forget(self, entry: TaskEntry, index: int, row: Row) -> int:
        """An older copy of a key just replaced in another location: forget it there
        (readers already prefer the newest generation); returns its size."""
        future = asyncio.ensure_future(self.on_writer(index, self.catalogs[index].forget, row))
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        entry.files_at[index] = entry.files_at.get(index, 1) - 1
        self.locations[index].files -= 1
        return int(row[8])

    def touch(self, supervisor_task_id: str) -> None:
        """Refresh a task's last access (its expiry); a PUT or GET of its data does this."""
        entry = self._tasks.get(supervisor_task_id)
        if entry is not None:
            entry.last_access = self.clock()
            entry.accesses += 1

    def record_served(self, supervisor_task_id: str, nbytes: int) -> None:
        entry = self._tasks.get(supervisor_task_id)
        if entry is not None:
            entry.served_bytes += nbytes
            entry.served_requests += 1

    # -- writes --------------------------------------------------------------------------

    def bulk(self, supervisor_task_id: str) -> BulkSession:
        """A session writing many partial segments of one task (see :class:`BulkSession`)."""
        return BulkSession(self, supervisor_task_id)

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
        if isinstance(result, ShuffleError):
            raise result
        return result

    async def delete_task(self, supervisor_task_id: str, *,
                          if_accesses: int | None = None) -> TaskEntry | None:
        """Remove everything of a supervisor task; idempotent. Uploads of it in flight are
        refused; commits already under way land first and are removed with the rest.
        Returns what was removed (None if nothing was held).

        With ``if_accesses`` (the sweeper's case) nothing happens unless the task's access
        count still equals it once the task's lock is held.
        """
        sup = supervisor_task_id
        async with self._lock(sup):
            current = self._tasks.get(sup)
            if if_accesses is not None and (current is None or current.accesses != if_accesses):
                return None
            writes = self._writes.get(sup)
            if writes is not None:
                sessions = list(writes.sessions)
                for session in sessions:
                    session.cancel()
                await asyncio.gather(*(session.settled() for session in sessions))
                await writes.idle.wait()
            entry = self._tasks.pop(sup, None)
            if entry is not None:
                for index, size in entry.pack_bytes.items():
                    self.locations[index].used_bytes -= size
                for index, count in entry.files_at.items():
                    self.locations[index].files -= count
            for pack in self._pool.drop_task(sup):
                await self.run(pack.close)
            failed: tuple[Location, OSError] | None = None
            for loc in self.locations:
                try:
                    await self._remove_at(loc, sup)
                except OSError as exc:  # keep going: remove what can be removed everywhere
                    failed = failed or (loc, exc)
                    self._leftovers.setdefault(sup, set()).add(loc.index)
                    if marks_unhealthy(exc):
                        loc.mark_unhealthy(f"{exc.strerror} while deleting")
            if failed is not None:
                # Say so rather than answer success: left alone, the data would be served
                # again after a restart. remove_leftovers() finishes the job once the disk
                # recovers (each sweep), as does a retried DELETE.
                loc, exc = failed
                log.error("could not delete all of %s on %s: %s", sup, loc.path, exc)
                raise translate(exc, str(loc.path), f"deleting supervisor task {sup}")
            self._leftovers.pop(sup, None)
            if self.seals.pop(sup, None) is not None:
                for loc in self.locations:
                    try:
                        await self.run(seals.remove_seal, loc.path, sup)
                    except OSError as exc:  # a stale seal is harmless: the data is gone
                        log.warning("could not remove the seal of %s at %s: %s",
                                    sup, loc.path, exc)
        self._notify(sup)
        return entry

    async def _remove_at(self, loc: Location, sup: str) -> None:
        """Forget ``sup``'s rows at ``loc``, then remove its packs (rows first: a pack
        without rows is an orphan recovery removes; rows without a pack are dropped too)."""
        catalog = self.catalogs[loc.index]
        await self.on_writer(loc.index, catalog.delete_task, sup)
        await self.run(_remove_tree, loc.path / sup)

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
                        await self._remove_at(loc, sup)
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

    async def open_partial(self, key: PartialKey) -> tuple[PartialMeta, IO[bytes]]:
        """The newest generation of ``key`` and its pack, open.

        If the task is deleted between lookup and open, look again: a reader gets the old
        or the new bytes complete, or NotFound, never a mix (packs are append-only).
        """
        return await self._open_partial(key)

    async def open_many(self, metas: Sequence[PartialMeta]) -> list[IO[bytes]]:
        """Open the packs of ``metas`` (each once) up front; one file object per meta."""
        return await self._open_many(metas)


def _close_pack(pack: packs.Pack) -> None:
    pack.close()
    pack.remove_if_fresh()
