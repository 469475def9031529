"""One upload session: the partial segments of one request (a single PUT or a bulk batch).

Small partials (up to :data:`SMALL` bytes, held in memory by the caller) are gathered and
validated together, then appended with one write per :data:`WRITE_BATCH`; large ones are
streamed onto a pack as they arrive. Each is committed on its own through the location's
group commit as soon as it is written, without waiting for the rest of the session; the
session's :meth:`finish` waits until every one of them is durable. Where each write goes
(the session's packs, one per location) is :mod:`shuffled.storage.write.sessionpacks`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from shuffled.errors import InsufficientStorage, InvalidBody, ShuffleError, TooLarge
from shuffled.protocol import PartialKey, PartialStatus
from shuffled.storage.write.admission import Pending
from shuffled.storage.commit.written import Written
from shuffled.storage.write.append import Append, Small, append_small
from shuffled.storage.ondisk.arrowfile import EOS, SchemaMessage
from shuffled.storage.commit.committer import Landing
from shuffled.storage.location import Location
from shuffled.storage.oserrors import marks_unhealthy, translate
from shuffled.storage.write.outcomes import Outcome, PutResult, Rejected
from shuffled.storage.ondisk.records import PartialMeta
from shuffled.storage.write.sessionpacks import SessionPacks, Writing, deleted

SMALL = 1 << 20  # partials up to this size are gathered in memory
WRITE_BATCH = 1 << 20  # bytes gathered before one I/O-thread hop writes them
RESERVE_STEP = 8 << 20  # reservation growth while streaming a body of unknown length
FLUSHES_IN_FLIGHT = 2  # gathered batches validated and written while the next is read
# Written partials are handed to the group commit once this many bytes of them are waiting,
# when the sender pauses, or at the end of the request: a batch streaming steadily pays one
# round of syncs per DEFER_BYTES, not one per group that happened to be ready (each round
# is an fdatasync and a WAL fsync, several ms apiece: more than the bytes' own write).
DEFER_BYTES = 32 << 20


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
        self._packs = SessionPacks(supervisor_task_id, parts)
        self._small: list[tuple[PartialKey, Small]] = []
        self._small_bytes = 0
        self._small_slots: list[int] = []  # where each gathered partial's outcome goes
        self._writing: list[asyncio.Task[None]] = []  # gathered batches being written
        # Per partial: the refusal, or its meta and commit future; None while gathered.
        self._results: list[_Pending | None] = []
        # Written, not yet handed to the group commit: (location, result slot, key, written).
        self._deferred: list[tuple[Location, int, PartialKey, Written]] = []
        self._deferred_bytes = 0
        self._eager = False  # the sender paused: commit what is written at once
        self._pending = Pending()  # added by this session, not yet committed (quotas)

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
            await self._packs.release()
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
        if self.parts.uploads.deleting(self.sup):
            await self.parts.uploads.wait_for_delete(self.sup)
        if self.cancelled:
            raise deleted(self.sup)
        self.parts.admission.admit(key, whole, self._pending)  # sealed, failed, quotas
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
        await self._drain_writes()  # a streamed body appends after placing: pack to itself
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
        self._packs.cancel()

    async def settled(self) -> None:
        """Wait until no file work of placing a write is under way (a DELETE removes the
        task's directories only then: a pack being created would recreate them)."""
        await self._packs.settled()

    async def _stream(self, key: PartialKey, body: AsyncIterator[bytes], length: int | None,
                      expected_crc: int | None) -> None:
        run = self.parts.threads.run
        limit = self.settings.max_partial_bytes
        loc, pack, _ = await self._packs.place(length or 0, None)
        reserved = length or 0
        loc.reserved_bytes += reserved
        append = Append(pack, self.settings.fsync)
        pack.busy = True  # until the stream is whole or cut off: no commit record meanwhile
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
                    if length is None:  # admitted without a size: count it as it comes
                        self.parts.admission.grow(key, size - reserved, self._pending)
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
                raise self._packs.failed(loc, exc, f"writing {key}") from exc
            raise
        finally:
            loc.reserved_bytes -= reserved
            pack.busy = False
            self._release_waiting()
        self._results.append(None)
        self._defer(loc, [(len(self._results) - 1, key, written)])

    async def _cut(self, append: Append) -> None:
        try:
            await asyncio.shield(self.parts.threads.run(append.discard))
        except (OSError, asyncio.CancelledError):
            append.pack.dead = True  # cannot cut it back: never append to it again

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
            loc, _, outcomes = await self._packs.place(
                total, append_small, [s for _, s in items], self.settings.fsync)
        except ShuffleError as exc:
            for slot in slots:
                self._results[slot] = exc
            self._release_waiting()
            return
        good = [(slot, key, outcome) for slot, (key, _), outcome
                in zip(slots, items, outcomes, strict=True) if not isinstance(outcome, ShuffleError)]
        for slot, outcome in zip(slots, outcomes, strict=True):
            if isinstance(outcome, ShuffleError):
                self._results[slot] = outcome
        if good:
            self._defer(loc, good)
        else:
            self._release_waiting()

    def _release_waiting(self) -> None:
        """A write ended with nothing to commit: partials that waited for its pack go now
        if the sender paused (see :meth:`_submit_deferred`)."""
        if self._eager and self._deferred:
            self._submit_deferred()

    def _defer(self, loc: Location, written: list[tuple[int, PartialKey, Written]]) -> None:
        """Queue written partials for the group commit (see :data:`DEFER_BYTES`)."""
        for slot, key, w in written:
            self._deferred.append((loc, slot, key, w))
            self._deferred_bytes += w.stored
        if self._eager or self._deferred_bytes >= DEFER_BYTES:
            self._submit_deferred()

    def _submit_deferred(self) -> None:
        """Hand every queued partial to its location's group commit, one submission per
        pack (a group syncs each pack once). Those of a pack being appended to wait for
        the next call (their commit record goes after that append, not into it): one
        comes when that append is done, or at the end of the request."""
        deferred, self._deferred, self._deferred_bytes = self._deferred, [], 0
        by_pack: dict[int, list[tuple[Location, int, PartialKey, Written]]] = {}
        for item in deferred:
            if item[3].pack.busy:
                self._deferred.append(item)
                self._deferred_bytes += item[3].stored
                continue
            by_pack.setdefault(id(item[3].pack), []).append(item)
        for items in by_pack.values():
            submitted = self._submit(items[0][0], [(key, w) for _, _, key, w in items])
            for (_, slot, _, _), result in zip(items, submitted, strict=True):
                self._results[slot] = result

    def _submit(self, loc: Location, written: list[tuple[PartialKey, Written]],
                ) -> list[_Pending]:
        if self.cancelled:
            return [deleted(self.sup) for _ in written]
        # A seal or a fail may have landed while these were on their way (see .admission).
        refused = self.parts.admission.may_commit_all(self.sup, [key for key, _ in written])
        kept = (written if refused is None  # none refused: the usual case
                else [w for w, r in zip(written, refused, strict=True) if r is None])
        if not kept:
            return [r for r in refused or () if r is not None]
        try:
            metas, future = self.parts.committer.submit(loc, kept)
        except OSError as exc:  # its commit record could not be written: none committed
            written[0][1].pack.dead = True  # its tail is unknown: never append to it again
            error = self._packs.failed(loc, exc, "writing a commit record")
            return [error if r is None else r for r in refused or [None] * len(written)]
        pending, nbytes, count = self._pending, sum(m.size for m in metas), len(metas)

        def landed(_: object) -> None:  # the book holds them now (or they failed)
            pending.bytes -= nbytes
            pending.partials -= count
        future.add_done_callback(landed)
        made: list[_Pending] = [
            _Committing(meta, future, i) for i, meta in enumerate(metas)]
        if refused is None:  # one per partial, in order
            return made
        committing = iter(made)
        return [next(committing) if r is None else r for r in refused]

    # -- the outcome ------------------------------------------------------------------------

    async def finish(self) -> list[Outcome]:
        """Wait until every partial added is durable; one outcome per partial that
        :meth:`add` did not refuse, in order."""
        await self._flush_small()
        await self._drain_writes()
        self._submit_deferred()
        out: list[Outcome] = []
        # Partials of one submission share its future: wait on each future once (a shield
        # per partial was a visible share of a small partial's cost).
        landed: dict[int, list[int | None] | OSError | ShuffleError] = {}
        for result in self._results:
            assert result is not None, "gathered partials were flushed above"
            if isinstance(result, ShuffleError):
                out.append(Rejected(result))
                continue
            meta, future, index = result
            got = landed.get(id(future))
            if got is None:
                try:
                    got = await asyncio.shield(future)
                except (OSError, ShuffleError) as exc:
                    got = exc
                landed[id(future)] = got
            if isinstance(got, OSError):
                loc = self.parts.locations[meta.location]
                if marks_unhealthy(got):
                    self.parts.packs.take_out(loc, f"{got.strerror} while committing")
                out.append(Rejected(translate(got, str(loc.path), f"committing {meta.key}")))
                continue
            if isinstance(got, ShuffleError):
                out.append(Rejected(got))
                continue
            out.append(PutResult(meta, PartialStatus.CREATED if got[index] is None
                                 else PartialStatus.REPLACED))
        return out
