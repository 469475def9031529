"""Deep storage for the store: what it asks of the tier, in one object.

:class:`DeepStorage` composes the tier (:mod:`.tier`), the per-task keys (:mod:`.crypt`),
the journal (:mod:`.journal`), the background copier (:mod:`.offload`) and the read-back
(:mod:`.readback`). The store calls it at five points: :meth:`start` after opening (resume
what a restart interrupted), :meth:`offload` after a seal, :meth:`local_copy` when a pack
to be read is not local, :meth:`forget` when a task is deleted or expires, and
:meth:`close`. Its blocking work runs on its own threads, so a slow or failing tier
never takes the threads uploads and reads run on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from collections.abc import Callable, Container, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shuffled.config import Settings
from shuffled.errors import CorruptData, LocationFailed, NotFound, Overloaded
from shuffled.storage.disk import Disk
from shuffled.storage.deep import crypt, manifest, peers, readback
from shuffled.storage.deep.instance import instance_id
from shuffled.storage.deep.journal import Copied, Entry, Journal
from shuffled.storage.deep.offload import Offloader
from shuffled.storage.deep.stats import DeepStats
from shuffled.storage.deep.tier import Tier
from shuffled.storage.location import Location
from shuffled.storage.ondisk.records import PartialMeta
from shuffled.storage.ondisk.slabrows import SlabRow
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")


BACKGROUND_NICE = 10  # the tier's threads yield the CPU to the data plane's


def _background_priority() -> None:
    """Lower this thread's CPU priority (Linux schedules threads apart): encrypting and
    checksumming a copy takes whole cores, which uploads and reads must not wait for."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                       os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICE)
    except (OSError, AttributeError):
        pass  # not Linux, or not allowed: the copy still runs, at the daemon's priority


class DeepStorage:
    """The tier behind the locations (event loop; blocking work on its own threads)."""

    def __init__(self, *, settings: Settings, disks: Sequence[Disk], threads: IoThreads,
                 seals: Mapping[str, frozenset[str]],
                 notify: Callable[[str], None] = lambda sup: None,
                 environ: Mapping[str, str] | None = None) -> None:
        assert settings.deep_storage, "deep storage is not configured"
        self.tier = Tier(settings.deep_storage, os.environ if environ is None else environ)
        self.secret = settings.deep_storage_key
        self.disks = list(disks)
        self.locations = [d.location for d in self.disks]
        self.threads = threads
        self.seals = seals
        # Offload copies take at most `concurrency` of these; the rest serve read-backs.
        self.executor = ThreadPoolExecutor(settings.deep_storage_concurrency + 2,
                                           thread_name_prefix="shuffled-deep",
                                           initializer=_background_priority)
        self.stats = DeepStats()
        self.journal = Journal(self.locations, threads, settings.fsync)
        self.instance = ""
        self.offloader = Offloader(
            tier=self.tier, secret=self.secret, instance=lambda: self.instance,
            disks=self.disks, threads=threads, executor=self.executor,
            journal=self.journal, seals=seals.get, stats=self.stats,
            concurrency=settings.deep_storage_concurrency,
            bandwidth=settings.deep_storage_bandwidth, on_done=notify)
        # Packs read back: (sup, location, pack) -> the cached file (see :mod:`.readback`).
        self.cached: dict[tuple[str, int, int], Path] = {}
        # Slabs read back: (sup, "<location>/<slab file>") -> the cached file.
        self.cached_slabs: dict[tuple[str, str], Path] = {}
        self._slab_fetches: dict[tuple[str, str], asyncio.Future[Path]] = {}
        self._fetches: dict[tuple[str, int, int], asyncio.Future[Path]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        # Lost peers' shares served here: (sup, instance) -> its manifest as a catalog.
        self.peers: dict[tuple[str, str], peers.PeerTask] = {}
        self._peer_loads: dict[tuple[str, str], asyncio.Future[peers.PeerTask]] = {}

    @property
    def pending(self) -> int:
        return self.offloader.pending

    async def _tier(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, held: Container[str] = frozenset()) -> None:
        """Name this daemon (stable across restarts), read the journal, resume offloads a
        restart interrupted, and retry deletions of the tier's copies still owed (those of
        tasks deleted; a task still ``held`` here, not sealed, keeps the packs it spilled)."""
        self.instance = await self.threads.run(instance_id, [loc.path for loc in self.locations])
        await self.journal.load()
        owed = [sup for sup, e in self.journal.entries.items()
                if e.deleting or (sup not in self.seals and not (e.evicted and sup in held))]
        if owed:
            task = asyncio.get_running_loop().create_task(self._delete_all(owed))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        for sup, subs in list(self.seals.items()):
            entry = self.journal.entries.get(sup)
            if entry is None or not entry.complete or entry.subs != subs:
                self.offloader.request(sup)
        log.info("deep storage %s as instance %s: %d tasks to offload", self.tier.uri,
                 self.instance, self.offloader.pending)

    async def close(self) -> None:
        await self.offloader.close()
        if self._background:
            await asyncio.wait(list(self._background), timeout=30)
        # Off the loop: a thread may still be in a request to the tier.
        await asyncio.to_thread(self.executor.shutdown, True, cancel_futures=True)

    async def idle(self) -> None:
        """Until no offload is running (tests and the drain)."""
        await self.offloader.idle()

    # -- offload and deletion -----------------------------------------------------------

    def offload(self, sup: str) -> None:
        """``sup`` was sealed: copy it (again) in the background."""
        self.offloader.request(sup)

    def offload_state(self, sup: str) -> dict[str, str]:
        """What a supervisor asks before counting on the tier: this daemon's instance and
        whether ``sup``'s copy of its current seal is ``complete``, ``pending``,
        ``failed`` (with why; retried at the next seal or start) or ``none``."""
        body = {"instance": self.instance}
        entry = self.journal.entries.get(sup)
        subs = self.seals.get(sup)
        if (entry is not None and entry.complete and not entry.deleting
                and entry.subs == subs):
            body["offload"] = "complete"  # a job for the same seal again ends at once
        elif sup in self.offloader.jobs:
            body["offload"] = "pending"
        elif sup in self.offloader.failures:
            body.update(offload="failed", error=self.offloader.failures[sup])
        else:
            body["offload"] = "none" if subs is None else "pending"
        return body

    def offloaded(self, sup: str) -> bool:
        entry = self.journal.entries.get(sup)
        return entry is not None and entry.complete and not entry.deleting

    async def forget(self, sup: str, *, everyone: bool = False) -> None:
        """``sup`` is deleted here: stop its offload, remove its objects from the tier and
        its read-back cache. A tier that fails is retried by :meth:`retry_deletions`.
        ``everyone`` (the supervisor's DELETE ended the task) removes the whole ``<sup>/``
        prefix, every daemon's copy, even if this one never offloaded the task; without it
        (an expiry here) only this daemon's ``<sup>/<instance>/``."""
        await self.offloader.stop(sup)
        for key in [k for k in self.cached if k[0] == sup]:
            del self.cached[key]
        for slab in [k for k in self.cached_slabs if k[0] == sup]:
            del self.cached_slabs[slab]
        for slot in [k for k in self.peers if k[0] == sup]:
            del self.peers[slot]
        for loc in self.locations:
            try:
                await self.threads.run(shutil.rmtree, readback.cache_dir(loc.path, sup), True)
            except OSError:
                pass
        entry = self.journal.entries.get(sup)
        if entry is None and not everyone:
            return  # never offloaded (the journal is written before any object)
        entry = entry or Entry(sup)
        entry.deleting, entry.everyone = True, entry.everyone or everyone
        try:
            await self.journal.save(entry)
        except OSError as exc:
            log.warning("could not record the deletion of %s's tier copy: %s", sup, exc)
        await self._delete(sup)

    async def _delete(self, sup: str) -> bool:
        entry = self.journal.entries.get(sup)
        if entry is None or (sup in self.seals and not entry.deleting):
            return True  # gone already, or sealed again since (a live task's copy)
        try:
            await self._tier(self.tier.delete_prefix, sup if entry.everyone
                             else manifest.task_prefix(sup, self.instance))
        except Exception as exc:
            self.stats.errors += 1
            log.error("could not remove %s's objects from %s (retried each sweep): %s",
                      sup, self.tier.uri, exc)
            return False
        await self.journal.drop(sup)
        return True

    async def _delete_all(self, sups: Sequence[str]) -> list[str]:
        return [sup for sup in sups if await self._delete(sup)]

    async def retry_deletions(self) -> list[str]:
        """Remove the tier copies earlier deletions could not; the tasks done."""
        return await self._delete_all([s for s, e in self.journal.entries.items()
                                       if e.deleting])

    # -- reads --------------------------------------------------------------------------

    def copied(self, meta: PartialMeta) -> Copied | None:
        """The tier's copy of ``meta``'s pack, if one is complete there."""
        entry = self.journal.entries.get(meta.key.supervisor_task_id)
        if entry is None or entry.deleting:
            return None
        return entry.packs.get(manifest.pack_key(meta.location, meta.pack))

    def cached_path(self, sup: str, location: int, pack: int) -> Path | None:
        return self.cached.get((sup, location, pack))

    async def local_copy(self, metas: Sequence[PartialMeta]) -> Path:
        """A local file holding the pack of ``metas`` (one pack), fetched from the tier
        once; the metas then point at it. CorruptData if what came back does not check,
        LocationFailed if no healthy location can hold the copy."""
        first = metas[0]
        sup = first.key.supervisor_task_id
        slot = (sup, first.location, first.pack)
        path = self.cached.get(slot)
        if path is None:
            running = self._fetches.get(slot)
            if running is None:
                running = asyncio.ensure_future(self._fetch(first, list(metas)))
                self._fetches[slot] = running
                running.add_done_callback(lambda _: self._fetches.pop(slot, None))
            path = await asyncio.shield(running)
        for meta in metas:
            meta.path = path
        return path

    async def _fetch(self, first: PartialMeta, metas: list[PartialMeta]) -> Path:
        sup = first.key.supervisor_task_id
        copied = self.copied(first)
        if copied is None:
            raise CorruptData(f"the pack of {first.key} is neither here nor in deep storage",
                              key=str(first.key))
        home = self.locations[first.location]
        roots = [home] + [loc for loc in self.locations if loc is not home]
        root = next((loc for loc in roots if loc.healthy), None)
        if root is None:
            raise LocationFailed("no healthy location to hold a pack read back from deep "
                                 "storage", location="all")
        key = manifest.pack_key(first.location, first.pack)
        dest = readback.cache_path(root.path, sup, key, copied)
        await self._read_back(sup, copied, dest, metas)
        self.cached[(sup, first.location, first.pack)] = dest
        return dest

    async def _read_back(self, sup: str, copied: Copied, dest: Path,
                         metas: list[PartialMeta]) -> None:
        """Fetch the pack ``copied`` into ``dest``, checked (see :mod:`.readback`)."""
        # A pack is fetched back only once its task's copy is complete, which recorded the
        # object: missing now, it is lost (CorruptData), not a tier that is slow to answer.
        await self._fetch_back(sup, copied, readback.fetch, dest, metas,
                               what=f"the deep-storage copy {copied.object}",
                               details={"key": str(metas[0].key)})

    async def _fetch_back(self, sup: str, copied: Copied,
                          fetch: Callable[..., int], dest: Path, checked: Any, *,
                          what: str, details: dict[str, Any]) -> None:
        """``fetch`` (a :mod:`.readback` function) of ``copied`` into ``dest``, checked
        against ``checked``, on the tier's threads. A copy that does not check is
        CorruptData naming ``what``; so is a missing object (a complete copy names it);
        anything else is Overloaded (the tier cannot be read now)."""
        secret = crypt.task_key(self.secret, sup)
        try:
            got = await self._tier(fetch, self.tier, secret, sup, copied, dest, checked)
        except FileNotFoundError as exc:
            self.stats.errors += 1
            raise CorruptData(f"{what} is missing from {self.tier.uri}, although its "
                              "offload recorded it", **details) from exc
        except (readback.Mismatch, crypt.Undecryptable) as exc:
            self.stats.errors += 1
            raise CorruptData(f"{what} does not check: {exc}", **details) from exc
        except Exception as exc:
            self.stats.errors += 1
            raise Overloaded(f"deep storage {self.tier.uri} could not be read: {exc}",
                             retry_after=5, tier=self.tier.uri) from exc
        self.stats.read_bytes += got
        log.info("read %s back from %s (%d bytes)", copied.object, self.tier.uri, got)

    # -- slabs ---------------------------------------------------------------------------

    async def local_slabs(self, sup: str, found: Sequence[tuple[int, SlabRow, Path]],
                          ) -> list[Path]:
        """The file each slab of ``found`` (location index, row, its local path) is read
        from: its own, or, for a slab evicted to the tier or on a location out of service
        with a copy in the tier, that copy read back (once; the fetches at once).
        CorruptData if a copy does not check or is missing from the tier, Overloaded if
        the tier cannot be read."""
        entry = self.journal.entries.get(sup)
        down = {loc.index for loc in self.locations if not loc.healthy}
        if entry is None or entry.deleting or not (entry.evicted_slabs or down):
            return [path for _, _, path in found]
        out: list[Path | None] = []
        waits = []
        for index, row, path in found:
            key = manifest.slab_key(index, row.sub, row.slab, row.attempt)
            if key not in entry.evicted_slabs and not (index in down and key in entry.slabs):
                out.append(path)
                continue
            out.append(None)
            waits.append(self._local_slab(sup, key, row, entry.slabs.get(key)))
        got = iter(await asyncio.gather(*waits))
        return [p if p is not None else next(got) for p in out]

    async def _local_slab(self, sup: str, key: str, row: SlabRow,
                          copied: Copied | None) -> Path:
        slot = (sup, key)
        path = self.cached_slabs.get(slot)
        if path is not None:
            return path
        if copied is None:
            raise CorruptData(f"slab {key} of {sup} is neither here nor in deep storage",
                              supervisorTaskId=sup)
        running = self._slab_fetches.get(slot)
        if running is None:
            dest = readback.slab_cache_path(readback.cache_dir(self._cache_root().path, sup),
                                            key, copied)
            running = asyncio.ensure_future(self._read_back_slab(sup, copied, dest, row))
            self._slab_fetches[slot] = running
            running.add_done_callback(lambda _: self._slab_fetches.pop(slot, None))
        path = await asyncio.shield(running)
        self.cached_slabs[slot] = path
        return path

    async def _read_back_slab(self, sup: str, copied: Copied, dest: Path,
                              row: SlabRow) -> Path:
        """Fetch the slab ``copied`` into ``dest``, checked against ``row`` (see
        :mod:`.readback`): CorruptData if it does not check or its object is missing (a
        complete copy names it), Overloaded if the tier cannot be read."""
        await self._fetch_back(
            sup, copied, readback.fetch_slab, dest, row,
            what=(f"the deep-storage copy {copied.object} of slab {row.sub}.{row.slab}."
                  f"{row.attempt} of {sup}"),
            details={"supervisorTaskId": sup, "subTaskId": row.sub})
        return dest

    # -- a lost peer's share ------------------------------------------------------------

    async def peer(self, sup: str, instance: str) -> peers.PeerTask:
        """The share of ``sup`` the daemon ``instance`` offloaded, served here from its
        manifest (read once, concurrent callers share the load). NotFound if its copy is
        not complete in the tier; Overloaded if the tier cannot be read; CorruptData if the
        manifest does not decrypt or parse."""
        slot = (sup, instance)
        got = self.peers.get(slot)
        if got is not None:
            return got
        running = self._peer_loads.get(slot)
        if running is None:
            running = asyncio.ensure_future(self._load_peer(sup, instance))
            self._peer_loads[slot] = running
            running.add_done_callback(lambda _: self._peer_loads.pop(slot, None))
        return await asyncio.shield(running)

    async def _load_peer(self, sup: str, instance: str) -> peers.PeerTask:
        name = manifest.manifest_object(sup, instance)
        try:
            data = await self._tier(self.tier.read, name)
        except FileNotFoundError:
            raise NotFound(f"daemon {instance} has no complete copy of {sup} in deep storage "
                           f"{self.tier.uri}: its offload had not finished, or the task was "
                           "deleted", supervisorTaskId=sup, instance=instance) from None
        except Exception as exc:
            self.stats.errors += 1
            raise Overloaded(f"deep storage {self.tier.uri} could not be read: {exc}",
                             retry_after=5, tier=self.tier.uri) from exc
        try:
            body = manifest.parse(crypt.decrypt(crypt.task_key(self.secret, sup), sup, name,
                                                data))
            task = peers.PeerTask(
                sup=sup, instance=instance, subs=frozenset(body["subTaskIds"]),
                packs=peers.parse_packs(body), rows=peers.parse_rows(body),
                cache=readback.cache_dir(self._cache_root().path, sup), threads=self.threads,
                fetch=lambda copied, dest, metas: self._read_back(sup, copied, dest, metas),
                slabs=manifest.parse_slabs(body),
                fetch_slab=lambda copied, dest, row: self._read_back_slab(sup, copied, dest,
                                                                          row))
        except (crypt.Undecryptable, ValueError, KeyError, TypeError) as exc:
            self.stats.errors += 1
            raise CorruptData(f"the manifest of {sup} from {instance} in {self.tier.uri} "
                              f"does not check: {exc}", supervisorTaskId=sup) from exc
        self.peers[(sup, instance)] = task
        log.info("serving %s's share of %s from %s: %d partials, %d slabs", instance, sup,
                 self.tier.uri, task.rows, len(task.slabs))
        return task

    def _cache_root(self) -> Location:
        root = next((loc for loc in self.locations if loc.healthy), None)
        if root is None:
            raise LocationFailed("no healthy location to hold packs read back from deep "
                                 "storage", location="all")
        return root
