"""The packs one upload session writes to, and placing a write on them.

A session holds at most one pack per location (taken from the pool or created) and appends
to it without interleaving with other uploads; a pack that fills up, fails or belongs to a
task being deleted is put aside and released when the session ends (partials of it may
still be waiting for their group commit). Placing a write picks the location by round
robin, checks its file system and writes in one I/O-thread call (:func:`shuffled.storage.ondisk.packs.on_pack`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shuffled.config import Settings
from shuffled.errors import Conflict, InsufficientStorage, ShuffleError
from shuffled.storage.ondisk import packs
from shuffled.storage.write.admission import Admission
from shuffled.storage.commit.committer import Committer
from shuffled.storage.tasks.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.oserrors import FULL_ERRNOS, marks_unhealthy, translate
from shuffled.storage.ondisk.packs import Pack
from shuffled.storage.placement.packsource import PackSource
from shuffled.storage.threads import IoThreads

INLINE_MAX = 256 << 10  # appends up to this size to an open pack run on the loop (place)


@dataclass(frozen=True, slots=True, kw_only=True)
class Writing:
    """The parts of the store an upload session works with (handed in by the store)."""

    settings: Settings
    locations: Sequence[Location]
    threads: IoThreads
    uploads: Uploads
    packs: PackSource
    committer: Committer
    admission: Admission
    # With deep storage: asked once before a 507 to free room by evicting what the tier
    # holds (:mod:`.deep.evict`); whether a location may take the size now.
    make_room: Callable[[int], Awaitable[bool]] | None = None


def deleted(sup: str) -> Conflict:
    """The refusal of an upload whose task was deleted while it was in flight."""
    return Conflict(f"supervisor task {sup} was deleted while this upload was in "
                    f"flight; nothing was stored", supervisorTaskId=sup)


class SessionPacks:
    """The packs of one upload session of task ``sup`` (event loop only)."""

    def __init__(self, sup: str, parts: Writing) -> None:
        self.sup = sup
        self.parts = parts
        self.cancelled = False  # the task is being deleted: place nothing more
        self._held: dict[int, Pack] = {}  # by location index: the next write's pack
        self._extra: list[Pack] = []  # packs to release at the end besides _held
        self._placing = 0  # place() calls with file work on an I/O thread (may create a pack)
        self._placed = asyncio.Event()  # set while _placing is 0
        self._placed.set()

    def cancel(self) -> None:
        """Never place on, nor reuse, any pack of this session again."""
        self.cancelled = True
        for pack in [*self._held.values(), *self._extra]:
            pack.dead = True

    async def settled(self) -> None:
        """Wait until no file work of :meth:`place` is under way."""
        await self._placed.wait()

    def _placing_done(self, _work: asyncio.Future[Any]) -> None:
        self._placing -= 1
        if not self._placing:
            self._placed.set()

    async def release(self) -> None:
        """Give every pack back to the pool (or close it); the session is over."""
        for pack in [*self._held.values(), *self._extra]:
            await self.parts.packs.release(pack)
        self._held.clear()
        self._extra.clear()

    def failed(self, loc: Location, exc: OSError, doing: str) -> ShuffleError:
        """Writing at ``loc`` failed with ``exc``: take the location out of service when the
        disk is at fault, never use the pack there again; the domain error to report."""
        if marks_unhealthy(exc):
            self.parts.packs.take_out(loc, f"{exc.strerror} while {doing}",
                                      full=exc.errno in FULL_ERRNOS)
        dead = self._held.get(loc.index)
        if dead is not None:
            dead.dead = True  # released (closed) when the session ends
        return translate(exc, str(loc.path), doing)

    def _keep(self, index: int, pack: Pack) -> None:
        """Hold ``pack`` for this session's next write at location ``index``; a second pack
        there (two batches were written at once) goes back to the pool."""
        held = self._held.get(index)
        if held is not None and held is not pack:
            self._extra.append(held)
        self._held[index] = pack

    async def place(self, size: int, job: Callable[..., Any] | None, *args: Any,
                    ) -> tuple[Location, Pack, Any]:
        """Pick a location by round robin that can take ``size`` more bytes and this
        session's pack there, then run ``job(pack, *args)`` on an I/O thread in the same
        call (checking the file system, creating the pack if needed, and writing: one hop).
        A location found full, read-only or failing is skipped (and taken out of service
        when the disk is at fault); InsufficientStorage when none is left, after asking
        deep storage (if any) once to make room."""
        source = self.parts.packs
        fsync = self.parts.settings.fsync
        tried: set[int] = set()
        make_room, made_room = self.parts.make_room, False
        reprobed = False
        while True:
            if self.cancelled:
                raise deleted(self.sup)
            try:
                loc = source.placement.choose(size, frozenset(tried))
            except InsufficientStorage:
                if not reprobed:
                    reprobed = True  # once: a full location may have room again
                    if await source.reprobe_full():
                        tried.clear()
                        continue
                if make_room is None or made_room or not await make_room(size):
                    raise
                made_room = True  # once: then every location is tried again
                tried.clear()
                continue
            pack = self._held.pop(loc.index, None)
            if pack is not None and (pack.dead or pack.size + size > source.max_bytes):
                # Not released now: partials of it may still be waiting for their group
                # commit, and releasing a pack nothing was committed to yet removes it.
                self._extra.append(pack)
                pack = None
            if pack is None:
                pack = source.take(loc.index, self.sup)
            number = source.new_number() if pack is None else 0
            loc.reserved_bytes += size
            args_ = (loc, self.sup, pack, number, fsync, size, job, *args)
            if pack is not None:
                pack.busy = True  # no commit record while this appends (committer._record)
            try:
                if pack is not None and size <= INLINE_MAX:
                    # An I/O-thread hop (thread wake-ups) costs more than checking and
                    # appending a small batch to the page cache.
                    placed, result = packs.on_pack(*args_)
                else:
                    work = asyncio.ensure_future(self.parts.threads.run(packs.on_pack, *args_))
                    self._placing += 1
                    self._placed.clear()
                    work.add_done_callback(self._placing_done)  # when the thread is done
                    placed, result = await asyncio.shield(work)
            except packs.Unusable as exc:
                if pack is not None:
                    self._keep(loc.index, pack)
                tried.add(loc.index)
                cause = exc.cause
                if isinstance(cause, OSError) and marks_unhealthy(cause):
                    source.take_out(loc, f"{cause.strerror} preparing a write",
                                    full=cause.errno in FULL_ERRNOS)
                continue
            except packs.WriteFailed as exc:
                self._keep(loc.index, exc.pack)
                raise self.failed(loc, exc.cause, "writing partial segments") from exc.cause
            finally:
                loc.reserved_bytes -= size
                if pack is not None:
                    pack.busy = False
            if self.cancelled:
                placed.dead = True  # its task was deleted meanwhile: the file is gone
            self._keep(loc.index, placed)
            return loc, placed, result
