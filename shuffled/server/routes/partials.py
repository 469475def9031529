"""One partial segment: ``PUT`` stores it (streamed to a pack, visible once durable),
``GET``/``HEAD`` serve it byte for byte (``Range``, ``ETag``, ``Content-Digest``).

Errors are raised as domain exceptions; :mod:`shuffled.server.errors` maps them.
"""

from __future__ import annotations

from aiohttp import web

from shuffled.errors import BadRequest
from shuffled.metrics import Served
from shuffled.protocol import (
    ARROW_STREAM, CONTENT_DIGEST, GENERATION_HEADER, REPR_DIGEST, ROWS_HEADER,
    format_crc32c, parse_crc32c,
)
from shuffled.server.middleware import SENT_BYTES
from shuffled.server.routes.params import partial_key
from shuffled.server.routes.peers import reads_of
from shuffled.server.state import state_of
from shuffled.server.streaming.bodies import refuse_encoded, upload_body
from shuffled.server.streaming.ranges import if_range_allows, parse_range
from shuffled.storage import byte_range

ACCEPTED_TYPES = (ARROW_STREAM, "application/octet-stream", "")


async def put_partial(request: web.Request) -> web.Response:
    state = state_of(request)
    key = partial_key(request)
    refuse_encoded(request)
    media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if media not in ACCEPTED_TYPES:
        raise BadRequest(f"Content-Type {media!r} is not {ARROW_STREAM}", field="Content-Type")
    expected = parse_crc32c(request.headers.get(CONTENT_DIGEST)
                            or request.headers.get(REPR_DIGEST))
    with state.uploads.slot():
        result = await state.store.put(key, upload_body(request, state.settings.upload_idle_timeout),
                                       request.content_length, expected)
    meta = result.meta
    state.metrics.received_bytes.inc(meta.size)
    state.metrics.received_partials.inc()
    body = meta.to_json()
    body["replaced"] = result.replaced
    body["location"] = str(state.store.locations[meta.location].path)
    return web.json_response(body, status=200 if result.replaced else 201, headers={
        "ETag": meta.etag, REPR_DIGEST: format_crc32c(meta.crc)})


def _not_modified(request: web.Request, etag: str) -> bool:
    # RFC 9110 section 13.1.2: If-None-Match with a matching tag (or *) -> 304 for GET.
    header = request.headers.get("If-None-Match")
    if not header:
        return False
    tags = {t.strip() for t in header.split(",")}
    return "*" in tags or etag in tags or f"W/{etag}" in tags


async def get_partial(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    key = partial_key(request)
    with state.downloads.slot():
        meta, fobj = await reads_of(request).open_partial(key)
        try:
            state.store.touch(key.supervisor_task_id)
            headers = {
                "ETag": meta.etag, "Accept-Ranges": "bytes", "Content-Type": ARROW_STREAM,
                REPR_DIGEST: format_crc32c(meta.crc), ROWS_HEADER: str(meta.rows),
                GENERATION_HEADER: str(meta.generation),
            }
            if _not_modified(request, meta.etag):
                return web.Response(status=304, headers=headers)
            rng = (parse_range(request.headers.get("Range"), meta.size)
                   if if_range_allows(request.headers.get("If-Range"), meta.etag) else None)
            response = web.StreamResponse(status=206 if rng else 200, headers=headers)
            if rng:
                offset, count = rng.start, rng.length
                response.headers["Content-Range"] = rng.content_range(meta.size)
            else:
                # RFC 9530: Content-Digest covers this message's content = the whole file.
                offset, count = 0, meta.size
                response.headers[CONTENT_DIGEST] = format_crc32c(meta.crc)
            response.content_length = count
            out = await state.answer(request, response)
            if request.method != "HEAD":
                await out.ranges([r if isinstance(r, bytes) else (fobj, *r)
                                  for r in byte_range(meta, offset, count)])
                request[SENT_BYTES] = count
                state.metrics.served_bytes.labels(Served.PARTIAL).inc(count)
                state.metrics.served_requests.labels(Served.PARTIAL).inc()
                state.store.record_served(key.supervisor_task_id, count)
            await out.write_eof()
            return response
        finally:
            fobj.close()
