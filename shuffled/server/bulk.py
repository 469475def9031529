"""``POST /tasks/{sup}/partials``: many partial segments of one task in one streamed request.

Frames (:mod:`shuffled.framing`) are read one after the other and each partial goes to the
store as it arrives (bodies up to 1 MiB read whole, larger ones streamed): the request is
never held whole. A refused partial (digest, Arrow, size, space) is answered as rejected and
the batch goes on; a framing error or a body that ends before the END frame stops it with
400 and ``complete: false``, so a cut connection is never taken for a whole batch. The
answer comes once every stored partial is durable (the store's group commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import ClientPayloadError, web

from shuffled.errors import RequestTimeout, ShuffleError
from shuffled.framing import (
    FIXED_LEN, MEDIA_TYPE, FramingError, data_key, end_count, parse_fixed, parse_header,
)
from shuffled.protocol import PartialKey, crc_hex, validate_id
from shuffled.server.state import state_of
from shuffled.storage.session import SMALL, PutResult

CHUNK = 1 << 20


class _Reader:
    """Exact reads from the request body through one buffer: most frame headers and small
    bodies are sliced from what already arrived, without another await. Every wait for
    more bytes is bounded by the idle timeout."""

    def __init__(self, request: web.Request, idle: float) -> None:
        self._content = request.content
        self._idle = idle
        self._buf = bytearray()

    async def _more(self) -> bytes:
        try:
            async with asyncio.timeout(self._idle):
                return await self._content.readany()
        except TimeoutError:
            raise RequestTimeout(f"bulk upload stalled: nothing received for {self._idle:g} s; "
                                 f"send the batch again") from None
        except (ClientPayloadError, ConnectionError) as exc:
            raise FramingError(f"the batch was cut: {exc}", field="body") from exc

    async def exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = await self._more()
            if not chunk:
                raise FramingError(f"the batch ended inside a frame ({len(self._buf)} of {n} "
                                   f"bytes): it was cut; nothing is complete before an END "
                                   f"frame", field="body")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def at_eof(self) -> bool:
        return not self._buf and not await self._more()

    async def chunks(self, n: int, taken: list[int]) -> AsyncIterator[bytes]:
        """``n`` bytes in chunks; ``taken[0]`` counts what was handed out."""
        while taken[0] < n:
            if not self._buf:
                chunk = await self._more()
                if not chunk:
                    raise FramingError("the batch ended inside a partial segment's body: "
                                       "it was cut", field="body")
                self._buf += chunk
            piece = bytes(self._buf[: min(CHUNK, n - taken[0])])
            del self._buf[: len(piece)]
            taken[0] += len(piece)
            yield piece

    async def skip(self, n: int) -> None:
        async for _ in self.chunks(n, [0]):
            pass


def _item(key: PartialKey) -> dict[str, Any]:
    return {"subTaskId": key.sub_task_id, "start": key.interval.start_iso,
            "end": key.interval.end_iso, "partitionId": key.partition_id}


def _stored(key: PartialKey, result: PutResult) -> dict[str, Any]:
    meta = result.meta
    return {**_item(key), "status": "replaced" if result.replaced else "created",
            "bytes": meta.size, "rows": meta.rows, "crc32c": crc_hex(meta.crc),
            "generation": meta.generation}


def _rejected(key: PartialKey, error: ShuffleError) -> dict[str, Any]:
    return {**_item(key), "status": "rejected",
            "error": {**error.to_json(), "status": error.status}}


async def post_partials(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if media != MEDIA_TYPE:
        raise FramingError(f"Content-Type {media!r} is not {MEDIA_TYPE}", field="Content-Type")
    reader = _Reader(request, state.settings.upload_idle_timeout)
    items: list[dict[str, Any] | None] = []
    pending: list[tuple[int, PartialKey]] = []  # added to the store: outcome from finish()
    failure: ShuffleError | None = None
    count = 0
    with state.uploads.slot():
        async with state.store.bulk(sup) as session:
            try:
                while True:
                    frame = parse_fixed(await reader.exactly(FIXED_LEN))
                    header = parse_header(frame, await reader.exactly(frame.header_len))
                    if frame.end:
                        if end_count(header) != count:
                            raise FramingError(f"END frame says {end_count(header)} partial "
                                               f"segments, {count} were sent", field="body")
                        if not await reader.at_eof():
                            raise FramingError("bytes follow the END frame", field="body")
                        break
                    key, crc = data_key(sup, header)
                    count += 1
                    items.append(None)
                    taken = [0]
                    try:
                        if frame.body_len <= SMALL:
                            body: Any = await reader.exactly(frame.body_len)
                            taken[0] = frame.body_len
                        else:
                            body = reader.chunks(frame.body_len, taken)
                        await session.add(key, body, frame.body_len, crc)
                        pending.append((len(items) - 1, key))
                    except FramingError:
                        raise
                    except RequestTimeout:
                        raise
                    except ShuffleError as exc:
                        items[-1] = _rejected(key, exc)
                        await reader.skip(frame.body_len - taken[0])
            except ShuffleError as exc:
                failure = exc
            outcomes = await session.finish()
    stored = 0
    for (index, key), outcome in zip(pending, outcomes, strict=True):
        if isinstance(outcome, PutResult):
            items[index] = _stored(key, outcome)
            stored += 1
            state.metrics.received_bytes.inc(outcome.meta.size)
            state.metrics.received_partials.inc()
        else:
            items[index] = _rejected(key, outcome)
    done = [i for i in items if i is not None]
    body = {"supervisorTaskId": sup, "complete": failure is None, "count": count,
            "stored": stored, "rejected": len(done) - stored, "partials": done}
    if failure is not None:
        return web.json_response({**failure.to_json(), **body}, status=failure.status)
    return web.json_response(body)
