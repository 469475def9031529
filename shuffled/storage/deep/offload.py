"""The background copier: a sealed task's packs and slabs, then its manifest, to the tier.

A task sealed here (or found sealed and not fully offloaded at start) gets one job, an
asyncio task: it reads the task's catalog rows (one query per location, on the tier's
threads with a connection of their own),
copies each pack not yet in the journal (or grown since) on the tier's own threads, at most
``deep_storage_concurrency`` at once over all tasks and at most ``deep_storage_bandwidth``
bytes a second, records each copy in the journal, and writes the manifest last. Nothing of
it runs on the event loop's thread or the store's I/O threads but the small queries and
journal writes, so the data plane is not held up. A seal that adds subtasks while a job
runs makes it run again. Each pack is read once: its CRC32C is computed as it is
encrypted and recorded, and checked on read-back (:mod:`.readback`). The slabs of the
sealed subtasks (docs/slab.md) are copied the same way beside the packs, each once (a
slab file never changes), and the manifest lists them with their catalog rows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shuffled.crc import crc32c
from shuffled.storage.disk import Disk
from shuffled.storage.ondisk import layout
from shuffled.storage.catalog import Row
from shuffled.storage.deep import crypt, manifest
from shuffled.storage.deep.journal import Copied, Entry, Journal
from shuffled.storage.deep.stats import DeepStats
from shuffled.storage.deep.tier import Tier
from shuffled.storage.ondisk.slabrows import SlabRow
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")

STOP_WAIT = 30.0  # seconds a stopping job may take to notice (one chunk, one request)


class Stopped(Exception):
    """The task's offload was stopped (its DELETE, or the daemon closing)."""


class Throttle:
    """At most ``rate`` bytes a second over every thread taking from it (0: no limit)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int, stop: threading.Event) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + n / self.rate
        if start > now and stop.wait(start - now):
            raise Stopped()


def copy_pack(tier: Tier, key: bytes, sup: str, name: str, path: Path, throttle: Throttle,
              stop: threading.Event) -> Copied:
    """Encrypt the pack at ``path`` into the object ``name`` (blocking); what was copied."""
    enc = crypt.Encryptor(key, sup, name)
    crc, size = 0, 0

    def pieces() -> Iterator[bytes]:
        nonlocal crc, size
        yield enc.header()
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(crypt.CHUNK):
                if stop.is_set():
                    raise Stopped()
                throttle.take(len(chunk), stop)
                crc = crc32c(chunk, crc)
                size += len(chunk)
                yield from enc.feed(chunk)
        yield enc.finish()

    tier.put(name, pieces())
    return Copied(name, size, crc)


def put_manifest(tier: Tier, key: bytes, sup: str, instance: str, subs: list[str],
                 packs: dict[str, Copied], rows: list[tuple[int, Row]],
                 slabs: Sequence[manifest.SlabCopy] = ()) -> None:
    """Build, encrypt and write the task's manifest (blocking: thousands of rows)."""
    name = manifest.manifest_object(sup, instance)
    body = manifest.build(sup=sup, instance=instance, subs=subs, packs=packs, rows=rows,
                          slabs=slabs)
    tier.put(name, [crypt.encrypt(key, sup, name, body)])


class Offloader:
    """One job per task being offloaded (event loop)."""

    def __init__(self, *, tier: Tier, secret: bytes, instance: Callable[[], str],
                 disks: Sequence[Disk],
                 threads: IoThreads, executor: ThreadPoolExecutor, journal: Journal,
                 seals: Callable[[str], frozenset[str] | None], stats: DeepStats,
                 concurrency: int, bandwidth: int,
                 on_done: Callable[[str], None] = lambda sup: None) -> None:
        self.tier = tier
        self.on_done = on_done  # a task's job ended (copied, failed or stopped)
        self.failures: dict[str, str] = {}  # sup -> why its last offload failed
        self.secret = secret
        self.instance = instance
        self.disks = list(disks)
        self.locations = [d.location for d in self.disks]
        self.threads = threads
        self.executor = executor
        self.journal = journal
        self.seals = seals
        self.stats = stats
        self.slots = asyncio.Semaphore(concurrency)
        self.throttle = Throttle(bandwidth)
        self.jobs: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._stops: dict[str, threading.Event] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.closing = False

    @property
    def pending(self) -> int:
        """Tasks being offloaded or waiting to be."""
        return len(self.jobs)

    def request(self, sup: str) -> None:
        """Offload ``sup`` (sealed): now, or again once its running job ends."""
        if self.closing:
            return
        self.failures.pop(sup, None)
        if sup in self.jobs:
            self._again.add(sup)
            return
        self._stops[sup] = threading.Event()
        self._idle.clear()
        job = asyncio.get_running_loop().create_task(self._job(sup), name=f"offload {sup}")
        self.jobs[sup] = job

    async def idle(self) -> None:
        """Until no task is being offloaded."""
        await self._idle.wait()

    async def stop(self, sup: str) -> None:
        """Stop ``sup``'s job, if any, and wait for it (its DELETE)."""
        self._again.discard(sup)
        job = self.jobs.get(sup)
        if job is None:
            return
        self._stops[sup].set()
        try:
            await asyncio.wait_for(asyncio.shield(job), STOP_WAIT)
        except (asyncio.TimeoutError, Exception):  # logged by the job
            pass

    async def close(self) -> None:
        self.closing = True
        for event in self._stops.values():
            event.set()
        if self.jobs:
            await asyncio.wait(list(self.jobs.values()), timeout=STOP_WAIT)

    async def _job(self, sup: str) -> None:
        try:
            while True:
                self._again.discard(sup)
                try:
                    await self._offload(sup)
                except Stopped:
                    return
                except Exception as exc:  # the tier or a disk failed: next seal or start
                    self.stats.errors += 1
                    self.failures[sup] = f"{type(exc).__name__}: {exc}"
                    log.error("offload of %s to %s failed: %s", sup, self.tier.uri, exc)
                    return
                if sup not in self._again or self.closing:
                    return
        finally:
            self.jobs.pop(sup, None)
            self._stops.pop(sup, None)
            self._again.discard(sup)
            if not self.jobs:
                self._idle.set()
            self.on_done(sup)

    async def _rows(self, sup: str) -> list[tuple[int, Row]]:
        rows: list[tuple[int, Row]] = []
        for loc, catalog in ((d.location, d.catalog) for d in self.disks):
            found = await asyncio.get_running_loop().run_in_executor(
                self.executor, catalog.task_rows, sup)
            rows.extend((loc.index, r) for r in found)
        return rows

    async def _slabs(self, sup: str, subs: frozenset[str]) -> list[tuple[int, SlabRow]]:
        """The slab rows of ``sup``'s sealed subtasks, per location."""
        out: list[tuple[int, SlabRow]] = []
        for loc, catalog in ((d.location, d.catalog) for d in self.disks):
            found = await asyncio.get_running_loop().run_in_executor(
                self.executor, catalog.task_slabs, sup, subs)
            out.extend((loc.index, r) for r in found)
        return out

    async def _offload(self, sup: str) -> None:
        subs = self.seals(sup)
        if subs is None:
            return  # deleted meanwhile
        held = self.journal.entries.get(sup)
        if held is not None and held.complete and held.subs == subs and not held.deleting:
            return
        entry = held if held is not None and not held.deleting else Entry(sup)
        entry.subs, entry.complete = subs, False
        await self.journal.save(entry)  # before any object: a DELETE knows to clean up
        rows = await self._rows(sup)
        instance = self.instance()
        key = crypt.task_key(self.secret, sup)
        wanted: dict[str, tuple[Path, str]] = {}
        for index, row in rows:
            loc = self.locations[index]
            pack = int(row.pack)
            wanted[manifest.pack_key(index, pack)] = (
                layout.pack_path(loc.path, sup, pack),
                manifest.pack_object(sup, instance, index, pack))
        # An evicted pack's file is gone and never grows again (its task's later uploads
        # go to new packs): its copy stands.
        entry.evicted &= set(wanted)
        sizes = {k: entry.packs[k].size if k in entry.evicted
                 else await self.threads.run(os.path.getsize, path)
                 for k, (path, _) in wanted.items()}
        todo = [k for k in wanted if k not in entry.packs or entry.packs[k].size != sizes[k]]
        # Slabs: a file never changes once committed, so one copy of it stands.
        slab_rows = {manifest.slab_key(index, r.sub, r.slab, r.attempt): (index, r)
                     for index, r in await self._slabs(sup, subs)}
        entry.evicted_slabs &= set(slab_rows)
        slab_todo = [k for k in slab_rows if k not in entry.slabs]
        stop = self._stops[sup]
        copies = [self._copy(entry, k, *wanted[k], key, stop) for k in todo]
        for k in slab_todo:
            index, r = slab_rows[k]
            copies.append(self._copy(
                entry, k, layout.slab_path(self.locations[index].path, sup, r.sub, r.slab,
                                           r.attempt),
                manifest.slab_object(sup, instance, k), key, stop, slab=True))
        outcomes = await asyncio.gather(*copies, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        entry.packs = {k: c for k, c in entry.packs.items() if k in wanted}
        entry.slabs = {k: c for k, c in entry.slabs.items() if k in slab_rows}
        listed = [(index, r, entry.slabs[k]) for k, (index, r) in sorted(slab_rows.items())]
        await asyncio.get_running_loop().run_in_executor(
            self.executor, put_manifest, self.tier, key, sup, instance, sorted(subs),
            dict(entry.packs), rows, listed)
        if stop.is_set():
            raise Stopped()
        entry.complete = True
        entry.offloaded_at = time.time()
        await self.journal.save(entry)
        self.stats.offloaded_tasks += 1
        log.info("offloaded %s to %s: %d packs, %d slabs", sup, self.tier.uri,
                 len(entry.packs), len(entry.slabs))

    async def _copy(self, entry: Entry, k: str, path: Path, name: str, key: bytes,
                    stop: threading.Event, slab: bool = False) -> None:
        async with self.slots:
            if stop.is_set():
                raise Stopped()
            copied = await asyncio.get_running_loop().run_in_executor(
                self.executor, copy_pack, self.tier, key, entry.sup, name, path,
                self.throttle, stop)
        (entry.slabs if slab else entry.packs)[k] = copied
        self.stats.offloaded_bytes += copied.size
        if slab:
            self.stats.offloaded_slabs += 1
        else:
            self.stats.offloaded_packs += 1
        await self.journal.save(entry)
