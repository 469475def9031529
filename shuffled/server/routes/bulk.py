"""``POST /tasks/{sup}/partials``: many partial segments of one task in one streamed request.

Frames of bulk format 1 (:mod:`shuffled.framing`: whole streams, JSON headers) or 2
(:mod:`shuffled.framing2`: a schema message once, then bodies under binary headers; the
first frame's magic says which) are read one after the other and each partial goes to the
store as it arrives (bodies up to 1 MiB read whole, larger ones streamed): the request is
never held whole. A refused partial (digest, Arrow, size, space) is answered as rejected and
the batch goes on; a framing error or a body that ends before the END frame stops it with
400 and ``complete: false``, so a cut connection is never taken for a whole batch. The
answer comes once every stored partial is durable (the store's group commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import ClientPayloadError, web

from shuffled.errors import (
    BadRequest, RequestTimeout, ShuffleError, TooLarge, UnsupportedEncoding,
)
from shuffled import framing2
from shuffled.framing import (
    FIXED_LEN, MEDIA_TYPE, FramingError, data_key, end_count, parse_fixed, parse_header,
)
from shuffled.protocol import PartialKey, PartialStatus, crc_hex, validate_id
from shuffled.server.streaming.bodies import refuse_encoded
from shuffled.server.errors import REJECT_REASON, error_headers
from shuffled.server.limits import Share
from shuffled.server.state import DaemonState, state_of
from shuffled.storage import SMALL, BulkSession, Outcome, PutResult, Rejected, SchemaMessage

CHUNK = 1 << 20
# The store gathers small partials (up to 1 MiB) before writing them. When the client has
# sent nothing for this long it is producing the next partial: write what was gathered now
# rather than when the batch ends (each partial commits as it arrives, not with the batch).
GATHER_WAIT = 0.005


class _Reader:
    """Exact reads from the request body, straight from the chunks aiohttp hands over: a
    read inside one chunk is a slice of it (a view when it takes most of the chunk, a copy
    when small, so a small body never pins a large chunk), a read across chunks is copied
    once into a buffer of its size (format 1 kept one growing buffer: three copies of every
    byte). Every wait for more bytes is bounded by the idle timeout; ``on_wait`` (if set)
    runs once the body has been silent for :data:`GATHER_WAIT`."""

    def __init__(self, request: web.Request, idle: float) -> None:
        self._content = request.content
        self._idle = idle
        self._chunk = memoryview(b"")
        self._at = 0
        self.on_wait: Callable[[], Awaitable[None]] | None = None

    async def _more(self) -> bytes:
        try:
            if self.on_wait is not None:
                hook, self.on_wait = self.on_wait, None
                try:
                    async with asyncio.timeout(GATHER_WAIT):
                        return await self._content.readany()  # cancellable: no bytes lost
                except TimeoutError:
                    await hook()
            async with asyncio.timeout(self._idle):
                return await self._content.readany()
        except TimeoutError:
            raise RequestTimeout(f"bulk upload stalled: nothing received for {self._idle:g} s; "
                                 f"send the batch again") from None
        except (ClientPayloadError, ConnectionError) as exc:
            raise FramingError(f"the batch was cut: {exc}", field="body") from exc

    async def _next(self, what: str) -> None:
        chunk = await self._more()
        if not chunk:
            raise FramingError(f"the batch ended inside {what}: it was cut; nothing is "
                               f"complete before an END frame", field="body")
        self._chunk, self._at = memoryview(chunk), 0

    async def exactly(self, n: int) -> memoryview:
        """The next ``n`` bytes."""
        left = len(self._chunk) - self._at
        if n <= left:
            at = self._at
            self._at += n
            view = self._chunk[at: at + n]
            return view if 2 * n >= len(self._chunk) else memoryview(bytes(view))
        out = bytearray(n)
        into = memoryview(out)
        done = 0
        while True:
            take = min(n - done, len(self._chunk) - self._at)
            into[done: done + take] = self._chunk[self._at: self._at + take]
            self._at += take
            done += take
            if done == n:
                return into
            await self._next(f"a frame ({done} of {n} bytes)")

    async def at_eof(self) -> bool:
        return self._at == len(self._chunk) and not await self._more()

    async def chunks(self, n: int, taken: list[int]) -> AsyncIterator[memoryview]:
        """``n`` bytes as views of the chunks received; ``taken[0]`` counts what was
        handed out."""
        while taken[0] < n:
            if self._at == len(self._chunk):
                await self._next("a partial segment's body")
            take = min(CHUNK, n - taken[0], len(self._chunk) - self._at)
            piece = self._chunk[self._at: self._at + take]
            self._at += take
            taken[0] += take
            yield piece

    async def skip(self, n: int) -> None:
        async for _ in self.chunks(n, [0]):
            pass


def _item(key: PartialKey) -> dict[str, Any]:
    return {"subTaskId": key.sub_task_id, "start": key.interval.start_iso,
            "end": key.interval.end_iso, "partitionId": key.partition_id}


def _stored(key: PartialKey, result: PutResult) -> dict[str, Any]:
    # One literal (the keys of _item first, as before): built per partial stored.
    meta, interval = result.meta, key.interval
    return {"subTaskId": key.sub_task_id, "start": interval.start_iso,
            "end": interval.end_iso, "partitionId": key.partition_id,
            "status": result.status, "bytes": meta.size, "rows": meta.rows,
            "crc32c": crc_hex(meta.crc), "generation": meta.generation}


def _rejected(key: PartialKey, error: ShuffleError) -> dict[str, Any]:
    return {**_item(key), "status": PartialStatus.REJECTED,
            "error": {**error.to_json(), "status": error.status}}


class _Batch:
    """One request's frames: what was added to the store and what was refused at once."""

    def __init__(self, sup: str, session: BulkSession, reader: _Reader,
                 max_schema_bytes: int, max_partials: int, held: Share) -> None:
        self.sup = sup
        self.session = session
        self.reader = reader
        self.max_schema_bytes = max_schema_bytes  # SCHEMA frames' bytes one request may send
        self.max_partials = max_partials  # partials one request may send
        self.held = held  # this request's share of the partials every upload holds
        self.items: list[dict[str, Any] | None] = []  # None: outcome from finish()
        self.pending: list[tuple[int, PartialKey]] = []
        self.count = 0

    async def read(self) -> None:
        """Read frames up to and including the END frame; FramingError/RequestTimeout stop."""
        reader = self.reader
        first = bytes(await reader.exactly(FIXED_LEN))
        if first[:4] == framing2.MAGIC:
            return await self._read_2(first)
        while True:
            if first:
                raw, first = first, b""
            else:
                raw = bytes(await reader.exactly(FIXED_LEN))
            frame = parse_fixed(raw)
            header = parse_header(frame, bytes(await reader.exactly(frame.header_len)))
            if frame.end:
                return await self._end(end_count(header))
            key, crc = data_key(self.sup, header)
            self._one_more()
            await self._add(key, crc, frame.body_len)

    async def _read_2(self, raw: bytes) -> None:
        """Bulk format 2: SCHEMA frames, then PARTIAL frames referring to them, then END."""
        reader = self.reader
        schemas: dict[int, SchemaMessage] = {}
        schema_bytes = 0
        while True:
            frame = framing2.parse_fixed(raw)
            header = bytes(await reader.exactly(frame.header_len))
            framing2.check_header(frame, header)
            if frame.kind == framing2.PARTIAL:
                key, schema_id, crc = framing2.partial_of(self.sup, header)
                schema = schemas.get(schema_id)
                if schema is None and schema_id != framing2.WHOLE:
                    raise FramingError(f"PARTIAL frame refers to schema {schema_id}, which no "
                                       f"SCHEMA frame before it sent", field="body")
                self._one_more()
                await self._add(key, crc, frame.body_len, schema)
            elif frame.kind == framing2.SCHEMA:
                schema_id = framing2.number(frame, header)
                # Each is kept (partials refer to it) until the request ends: bounded.
                schema_bytes += frame.body_len
                if schema_bytes > self.max_schema_bytes:
                    raise TooLarge(f"this upload sent {schema_bytes} bytes of SCHEMA frames, "
                                   f"over max_bulk_schema_bytes ({self.max_schema_bytes}): "
                                   "send a flush's schema once", field="body",
                                   limit=self.max_schema_bytes)
                try:
                    schemas[schema_id] = SchemaMessage.parse(
                        bytes(await reader.exactly(frame.body_len)))
                except ShuffleError as exc:  # the partials after it cannot be read
                    raise FramingError(exc.message, field="body") from exc
            else:
                return await self._end(framing2.number(frame, header))
            raw = bytes(await reader.exactly(FIXED_LEN))

    def _one_more(self) -> None:
        """Count a PARTIAL frame; TooLarge past ``max_partials``, Overloaded past
        ``max_held_partials`` held by every upload in flight. Each partial is held (its
        key, record and answer, ~1.5 KB) until the request answers, whatever its bytes:
        200,000 tiny ones in a 44 MB request held +337 MiB."""
        if self.count >= self.max_partials:
            raise TooLarge(f"this upload sends more than {self.max_partials} partial "
                           f"segments, over max_bulk_partials: send them in several "
                           f"uploads", field="body", limit=self.max_partials)
        self.held.take()
        self.count += 1

    async def _end(self, declared: int) -> None:
        """The END frame (either format): its count must match, and nothing may follow."""
        if declared != self.count:
            raise FramingError(f"END frame says {declared} partial segments, {self.count} "
                               f"were sent", field="body")
        if not await self.reader.at_eof():
            raise FramingError("bytes follow the END frame", field="body")

    async def _add(self, key: PartialKey, crc: int | None, length: int,
                   schema: SchemaMessage | None = None) -> None:
        self.items.append(None)
        taken = [0]
        try:
            if length <= SMALL:
                body: Any = await self.reader.exactly(length)
                taken[0] = length
            else:
                body = self.reader.chunks(length, taken)
            await self.session.add(key, body, length, crc, schema)
            self.pending.append((len(self.items) - 1, key))
            if length <= SMALL:
                # Gathered by the store: have it written if the client goes quiet.
                self.reader.on_wait = self.session.flush
        except (FramingError, RequestTimeout):
            raise  # the request itself failed: the batch stops
        except ShuffleError as exc:  # this partial alone is refused; its bytes are skipped
            self.items[-1] = _rejected(key, exc)
            await self.reader.skip(length - taken[0])


async def post_partials(request: web.Request) -> web.Response:
    """Store the frames of one bulk batch; answer per partial once they are durable."""
    state = state_of(request)
    sup = request.match_info["sup"]
    failure: ShuffleError | None = None
    try:
        sup = validate_id(sup, "supervisorTaskId")
        media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media != MEDIA_TYPE:
            raise BadRequest(f"Content-Type {media!r} is not {MEDIA_TYPE}", field="Content-Type")
        refuse_encoded(request)
    except (BadRequest, UnsupportedEncoding) as exc:  # every 400 of this route has the batch fields (none done)
        return _answer(request, sup, 0, [], exc)
    reader = _Reader(request, state.settings.upload_idle_timeout)
    # The partials are held (the share) until the answer is made of them.
    with state.uploads.slot(), state.held_partials.share() as held:
        async with state.store.bulk(sup) as session:
            batch = _Batch(sup, session, reader, state.settings.max_bulk_schema_bytes,
                           state.settings.max_bulk_partials, held)
            try:
                await batch.read()
            except ShuffleError as exc:  # framing, a cut, a stall, too many held: the
                failure = exc            # batch stops here
            outcomes = await session.finish()
        return _outcome(request, state, sup, batch, outcomes, failure)


def _outcome(request: web.Request, state: DaemonState, sup: str, batch: _Batch,
             outcomes: list[Outcome], failure: ShuffleError | None,
             ) -> web.Response:
    """The batch's answer from the store's outcomes of its partials."""
    received = received_bytes = 0
    for (index, key), outcome in zip(batch.pending, outcomes, strict=True):
        if isinstance(outcome, Rejected):
            batch.items[index] = _rejected(key, outcome.error)
            continue
        batch.items[index] = _stored(key, outcome)
        received += 1
        received_bytes += outcome.meta.size
    if received:  # counted once per batch: a locked counter update per partial cost more
        state.metrics.received_bytes.inc(received_bytes)
        state.metrics.received_partials.inc(received)
    # A frame cut inside its body has no item: count what was received whole.
    done = [i for i in batch.items if i is not None]
    return _answer(request, sup, len(done), done, failure)


def _answer(request: web.Request, sup: str, count: int, items: list[dict[str, Any]],
            failure: ShuffleError | None) -> web.Response:
    """The batch's answer: 200 when complete, else the failure's status and error fields
    with ``complete: false`` and what was decided before it."""
    stored = sum(1 for i in items if i["status"] != PartialStatus.REJECTED)
    body = {"supervisorTaskId": sup, "complete": failure is None, "count": count,
            "stored": stored, "rejected": len(items) - stored, "partials": items}
    if failure is None:
        return web.json_response(body)
    request[REJECT_REASON] = failure.code  # as the error middleware does for raised errors
    return web.json_response({**failure.to_json(), **body}, status=failure.status,
                             headers=error_headers(failure))
