"""One upload session: the partial segments of one request (a single PUT or a bulk batch).

Small partials (up to :data:`SMALL` bytes, held in memory by the caller) are gathered and
validated together, then appended with one write per :data:`WRITE_BATCH`; large ones are
streamed onto a pack as they arrive. Each is committed on its own through the location's
group commit as soon as it is written, without waiting for the rest of the session; the
session's :meth:`finish` waits until every one of them is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from shuffled.config import Settings
from shuffled.errors import Conflict, InsufficientStorage, InvalidBody, ShuffleError, TooLarge
from shuffled.protocol import PartialKey, PartialStatus
from shuffled.storage import packs
from shuffled.storage.append import Append, Small, Written, append_small
from shuffled.storage.arrowfile import EOS, SchemaMessage
from shuffled.storage.committer import Committer, Landing
from shuffled.storage.inflight import Uploads
from shuffled.storage.location import Location
from shuffled.storage.oserrors import marks_unhealthy, translate
from shuffled.storage.packs import Pack
from shuffled.storage.packsource import PackSource
from shuffled.storage.records import PartialMeta
from shuffled.storage.threads import IoThreads

SMALL = 1 << 20  # partials up to this size are gathered in memory
WRITE_BATCH = 1 << 20  # bytes gathered before one I/O-thread hop writes them
RESERVE_STEP = 8 << 20  # reservation growth while streaming a body of unknown length
INLINE_MAX = 256 << 10  # appends up to this size to an open pack run on the loop (_place)
FLUSHES_IN_FLIGHT = 2  # gathered batches validated and written while the next is read
# Written partials are handed to the group commit once this many bytes of them are waiting,
# when the sender pauses, or at the end of the request: a batch streaming steadily pays one
# round of syncs per DEFER_BYTES, not one per group that happened to be ready (each round
# is an fdatasync and a WAL fsync, several ms apiece: more than the bytes' own write).
DEFER_BYTES = 32 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Writing:
    """The parts of the store an upload session works with (handed in by the store)."""

    settings: Settings
    locations: Sequence[Location]
    threads: IoThreads
    uploads: Uploads
    packs: PackSource
    committer: Committer


@dataclass(frozen=True, slots=True)
class PutResult:
    """A partial segment stored (durable): its facts, and whether it was the first
    generation of its key or replaced one."""

    meta: PartialMeta
    status: Literal[PartialStatus.CREATED, PartialStatus.REPLACED]

    @property
    def replaced(self) -> bool:
        return self.status is PartialStatus.REPLACED


@dataclass(frozen=True, slots=True)
class Rejected:
    """A partial segment the store refused (nothing of it kept), and why."""

    error: ShuffleError
    status: Literal[PartialStatus.REJECTED] = PartialStatus.REJECTED


#: What became of one partial of a session (:meth:`BulkSession.finish`).
Outcome = PutResult | Rejected


class _Committing(NamedTuple):
    """A written partial handed to the group commit: its meta, its group's commit future
    and its place in that group (the future's result is the replaced generations)."""

    meta: PartialMeta
    future: Landing
    at: int


# Per partial while the session runs: the refusal, or its commit under way.
_Pending = ShuffleError | _Committing


async def _framed(schema: SchemaMessage, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A body sent alone (bulk format 2) as the stream it stands for."""
    yield schema.data
    async for chunk in body:
        yield chunk
    yield EOS


class BulkSession:
    """Partials of one supervisor task written by one request; use as ``async with``."""

    def __init__(self, supervisor_task_id: str, parts: Writing) -> None:
        self.parts = parts
        self.settings = parts.settings
        self.sup = supervisor_task_id
        self.cancelled = False  # set by a DELETE of the task: nothing more is committed
        self._packs: dict[int, Pack] = {}
        self._small: list[tuple[PartialKey, Small]] = []
        self._small_bytes = 0
        self._small_slots: list[int] = []  # where each gathered partial's outcome goes
        self._writing: list[asyncio.Task[None]] = []  # gathered batches being written
        self._extra: list[Pack] = []  # packs to release at the end besides _packs
        self._placing = 0  # _place calls with file work on an I/O thread (may create a pack)
        self._placed = asyncio.Event()  # set while _placing is 0
        self._placed.set()
        # Per partial: the refusal, or its meta and commit future; None while gathered.
        self._results: list[_Pending | None] = []
        # Written, not yet handed to the group commit: (location, result slot, key, written).
        self._deferred: list[tuple[Location, int, PartialKey, Written]] = []
        self._deferred_bytes = 0
        self._eager = False  # the sender paused: commit what is written at once

    async def __aenter__(self) -> BulkSession:
        self.parts.uploads.open(self.sup, self)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            if exc_info[0] is None:
                await self._flush_small()
        finally:
            if self._writing:
                await asyncio.shield(asyncio.gather(*self._writing, return_exceptions=True))
                self._writing.clear()
            self._submit_deferred()  # whatever was written whole is committed, as it came
            self._small.clear()
            self._small_slots.clear()
            # Commits under way complete whatever happened to the request: wait for them
            # (shielded) before the packs they sync go back to the pool.
            futures = list({id(r.future): r.future for r in self._results
                            if isinstance(r, _Committing)}.values())
            if futures:
                await asyncio.shield(asyncio.gather(*futures, return_exceptions=True))
            for pack in [*self._packs.values(), *self._extra]:
                await self.parts.packs.release(pack)
            self._packs.clear()
            self._extra.clear()
            self.parts.uploads.close(self.sup, self)

    # -- adding partials ------------------------------------------------------------------

    async def add(self, key: PartialKey, body: bytes | bytearray | memoryview | AsyncIterator[bytes],
                  length: int | None, expected_crc: int | None,
                  schema: SchemaMessage | None = None) -> None:
        """Write one partial segment; its commit is queued, not awaited.

        ``body`` is a whole Arrow IPC stream of ``length`` bytes (``expected_crc`` its
        CRC32C) or, with ``schema`` (bulk format 2), the stream's body alone: its dictionary
        and record batch messages, ``length`` and ``expected_crc`` being the body's.

        Raises a ShuffleError when this partial is refused (nothing of it stays; the session
        goes on). A refusal found while validating a gathered small partial is reported by
        :meth:`finish` instead. If this raises while consuming an iterator body, the caller
        drains what is left of that body.
        """
        if key.supervisor_task_id != self.sup:
            raise ValueError(f"{key} does not belong to supervisor task {self.sup}")
        self._eager = False
        limit = self.settings.max_partial_bytes
        whole = length + len(schema.data) + len(EOS) if schema and length is not None else length
        if whole is not None and whole > limit:
            raise TooLarge(f"partial segment of {whole} bytes exceeds the limit of {limit} "
                           f"bytes (max_partial_bytes)", limit=limit)
        await self.parts.uploads.wait_for_delete(self.sup)
        if self.cancelled:
            raise self._conflict()
        if isinstance(body, (bytes, bytearray, memoryview)) and len(body) <= SMALL:
            view = memoryview(body).cast("B")
            if length is not None and view.nbytes != length:
                raise InvalidBody(f"body has {view.nbytes} bytes but its length said {length}")
            self._small.append((key, Small(view, expected_crc, schema)))
            self._small_slots.append(len(self._results))
            self._results.append(None)
            self._small_bytes += view.nbytes
            if self._small_bytes >= WRITE_BATCH:
                await self._flush_small()
            return
        await self._flush_small()  # keep the order of the partials
        await self._drain_writes()  # a streamed body appends after _place: pack to itself
        if isinstance(body, (bytes, bytearray, memoryview)):
            data = memoryview(body).cast("B")

            async def once() -> AsyncIterator[bytes]:
                for at in range(0, len(data), WRITE_BATCH):
                    yield bytes(data[at: at + WRITE_BATCH])
            body = once()
        if schema is not None:  # streamed as the whole stream it stands for
            if expected_crc is not None and length is not None:
                expected_crc = schema.stream_crc(expected_crc, length)
            length = whole
            body = _framed(schema, body)
        await self._stream(key, body, length, expected_crc)

    def cancel(self) -> None:
        """The task is being deleted: refuse what comes next, never reuse its packs."""
        self.cancelled = True
        for pack in [*self._packs.values(), *self._extra]:
            pack.dead = True

    async def settled(self) -> None:
        """Wait until no file work of :meth:`_place` is under way (a DELETE removes the
        task's directories only then: a pack being created would recreate them)."""
        await self._placed.wait()

    def _placing_done(self, _work: asyncio.Future[Any]) -> None:
        self._placing -= 1
        if not self._placing:
            self._placed.set()

    def _conflict(self) -> Conflict:
        return Conflict(f"supervisor task {self.sup} was deleted while this upload was in "
                        f"flight; nothing was stored", supervisorTaskId=self.sup)

    async def _stream(self, key: PartialKey, body: AsyncIterator[bytes], length: int | None,
                      expected_crc: int | None) -> None:
        run = self.parts.threads.run
        limit = self.settings.max_partial_bytes
        loc, pack, _ = await self._place(length or 0, None)
        reserved = length or 0
        loc.reserved_bytes += reserved
        append = Append(pack, self.settings.fsync)
        try:
            pending: list[bytes] = []
            pending_size = size = 0
            async for chunk in body:
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"partial segment exceeds the limit of {limit} bytes "
                                   f"(max_partial_bytes)", limit=limit)
                if length is not None and size > length:
                    raise InvalidBody(f"body has more than the {length} bytes announced")
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
                    await run(append.write, pending)
                    pending, pending_size = [], 0
            if pending:
                await run(append.write, pending)
            if length is not None and size != length:
                raise InvalidBody(f"body has {size} bytes but its length said {length}")
            written = await run(append.finish, expected_crc)
        except BaseException as exc:
            await self._cut(append)
            if isinstance(exc, OSError):
                raise self._failed(loc, exc, f"writing {key}") from exc
            raise
        finally:
            loc.reserved_bytes -= reserved
        self._results.append(None)
        self._defer(loc, [(len(self._results) - 1, key, written)])

    async def _cut(self, append: Append) -> None:
        try:
            await asyncio.shield(self.parts.threads.run(append.discard))
        except (OSError, asyncio.CancelledError):
            append.pack.dead = True  # cannot cut it back: never append to it again

    def _failed(self, loc: Location, exc: OSError, doing: str) -> ShuffleError:
        if marks_unhealthy(exc):
            self.parts.packs.take_out(loc, f"{exc.strerror} while {doing}")
        dead = self._packs.get(loc.index)
        if dead is not None:
            dead.dead = True  # released (closed) when the session ends
        return translate(exc, str(loc.path), doing)

    async def flush(self) -> None:
        """Start writing the gathered small partials now and commit them once written (a
        bulk request whose sender paused: what arrived is committed without waiting for
        more)."""
        self._eager = True
        self._submit_deferred()
        await self._flush_small()

    async def _flush_small(self) -> None:
        """Hand the gathered partials to a background write (validation and append on an
        I/O thread) and go on reading: up to :data:`FLUSHES_IN_FLIGHT` at once, so on two
        cores the request is read while the previous batch is checked and written."""
        if not self._small:
            return
        items, slots = self._small, self._small_slots
        self._small, self._small_slots, self._small_bytes = [], [], 0
        self._writing.append(asyncio.ensure_future(self._write_small(items, slots)))
        while len(self._writing) >= FLUSHES_IN_FLIGHT:
            await self._writing.pop(0)

    async def _drain_writes(self) -> None:
        while self._writing:
            await self._writing.pop(0)

    async def _write_small(self, items: list[tuple[PartialKey, Small]], slots: list[int]) -> None:
        total = sum(s.data.nbytes + (len(s.schema.data) if s.schema else 0) for _, s in items)
        try:
            loc, _, outcomes = await self._place(total, append_small, [s for _, s in items],
                                                 self.settings.fsync)
        except ShuffleError as exc:
            for slot in slots:
                self._results[slot] = exc
            return
        good = [(slot, key, outcome) for slot, (key, _), outcome
                in zip(slots, items, outcomes, strict=True) if not isinstance(outcome, ShuffleError)]
        for slot, outcome in zip(slots, outcomes, strict=True):
            if isinstance(outcome, ShuffleError):
                self._results[slot] = outcome
        if good:
            self._defer(loc, good)

    def _defer(self, loc: Location, written: list[tuple[int, PartialKey, Written]]) -> None:
        """Queue written partials for the group commit (see :data:`DEFER_BYTES`)."""
        for slot, key, w in written:
            self._deferred.append((loc, slot, key, w))
            self._deferred_bytes += w.stored
        if self._eager or self._deferred_bytes >= DEFER_BYTES:
            self._submit_deferred()

    def _submit_deferred(self) -> None:
        """Hand every queued partial to its location's group commit, one submission per
        pack (a group syncs each pack once)."""
        deferred, self._deferred, self._deferred_bytes = self._deferred, [], 0
        by_pack: dict[int, list[tuple[Location, int, PartialKey, Written]]] = {}
        for item in deferred:
            by_pack.setdefault(id(item[3].pack), []).append(item)
        for items in by_pack.values():
            submitted = self._submit(items[0][0], [(key, w) for _, _, key, w in items])
            for (_, slot, _, _), result in zip(items, submitted, strict=True):
                self._results[slot] = result

    def _submit(self, loc: Location, written: list[tuple[PartialKey, Written]],
                ) -> list[_Pending]:
        if self.cancelled:
            return [self._conflict() for _ in written]
        metas, future = self.parts.committer.submit(loc, written)
        return [_Committing(meta, future, i) for i, meta in enumerate(metas)]

    def _keep(self, index: int, pack: Pack) -> None:
        """Hold ``pack`` for this session's next write at location ``index``; a second pack
        there (two batches were written at once) goes back to the pool."""
        held = self._packs.get(index)
        if held is not None and held is not pack:
            self._extra.append(held)
        self._packs[index] = pack

    async def _place(self, size: int, job: Callable[..., Any] | None, *args: Any,
                     ) -> tuple[Location, Pack, Any]:
        """Pick a location by round robin that can take ``size`` more bytes and this
        session's pack there, then run ``job(pack, *args)`` on an I/O thread in the same
        call (checking the file system, creating the pack if needed, and writing: one hop).
        A location found full, read-only or failing is skipped (and taken out of service
        when the disk is at fault); InsufficientStorage when none is left."""
        source = self.parts.packs
        tried: set[int] = set()
        while True:
            if self.cancelled:
                raise self._conflict()
            loc = source.placement.choose(size, frozenset(tried))
            pack = self._packs.pop(loc.index, None)
            if pack is not None and (pack.dead or pack.size + size > source.max_bytes):
                # Not released now: partials of it may still be waiting for their group
                # commit, and releasing a pack nothing was committed to yet removes it.
                self._extra.append(pack)
                pack = None
            if pack is None:
                pack = source.take(loc.index, self.sup)
            number = source.new_number() if pack is None else 0
            loc.reserved_bytes += size
            args_ = (loc, self.sup, pack, number, self.settings.fsync, size, job, *args)
            try:
                if pack is not None and size <= INLINE_MAX:
                    # An I/O-thread hop costs ~0.2 ms here (thread wake-ups on 2 vCPUs),
                    # more than checking and appending a small batch to the page cache.
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
                    source.take_out(loc, f"{cause.strerror} preparing a write")
                continue
            except packs.WriteFailed as exc:
                self._keep(loc.index, exc.pack)
                raise self._failed(loc, exc.cause, "writing partial segments") from exc.cause
            finally:
                loc.reserved_bytes -= size
            if self.cancelled:
                placed.dead = True  # its task was deleted meanwhile: the file is gone
            self._keep(loc.index, placed)
            return loc, placed, result

    # -- the outcome ------------------------------------------------------------------------

    async def finish(self) -> list[Outcome]:
        """Wait until every partial added is durable; one outcome per partial that
        :meth:`add` did not refuse, in order."""
        await self._flush_small()
        await self._drain_writes()
        self._submit_deferred()
        out: list[Outcome] = []
        for result in self._results:
            assert result is not None, "gathered partials were flushed above"
            if isinstance(result, ShuffleError):
                out.append(Rejected(result))
                continue
            meta, future, index = result
            try:
                old = (await asyncio.shield(future))[index]
            except OSError as exc:
                loc = self.parts.locations[meta.location]
                if marks_unhealthy(exc):
                    self.parts.packs.take_out(loc, f"{exc.strerror} while committing")
                out.append(Rejected(translate(exc, str(loc.path), f"committing {meta.key}")))
                continue
            except ShuffleError as exc:
                out.append(Rejected(exc))
                continue
            out.append(PutResult(meta, PartialStatus.CREATED if old is None
                                 else PartialStatus.REPLACED))
        return out
