"""Slabs (docs/slab.md): ``POST /tasks/{sup}/slabs`` stores one phase-1 flush as it came;
``GET /tasks/{sup}/shard`` answers one shard of one time chunk of a sealed task, from every
slab of its sealed subtasks, as ONE Arrow IPC stream (whole batches by sendfile, the edge
batches trimmed to the shard's keys).

A shard is named by its chunk (``start``, ``end``) and its keys, ``[keyFrom, keyTo)`` in
hex (either may be left out: unbounded). ``X-Shuffled-Rows`` says the rows sent and
``X-Shuffled-Slabs`` how many slabs of the sealed subtasks this daemon holds for the task,
so that a reader can tell a daemon that lost a slab from one that has no rows for it.
"""

from __future__ import annotations

from aiohttp import web

from shuffled.errors import BadRequest
from shuffled.metrics import Served
from shuffled.protocol import ARROW_STREAM, ROWS_HEADER, Interval, validate_id
from shuffled.server.middleware import SENT_BYTES
from shuffled.server.state import state_of
from shuffled.server.streaming.bodies import refuse_encoded, upload_body
from shuffled.slab.wire import CONTENT_TYPE

SLABS_HEADER = "X-Shuffled-Slabs"
MAX_KEY = 4096  # bytes of a shard bound


def _key(request: web.Request, name: str) -> bytes | None:
    text = request.query.get(name)
    if text is None:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise BadRequest(f"{name} is a key in hex; got {text[:64]!r}", field=name) from None
    if len(key) > MAX_KEY:
        raise BadRequest(f"{name} is at most {MAX_KEY} bytes", field=name)
    return key


async def post_slab(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    refuse_encoded(request)
    media = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if media != CONTENT_TYPE:
        raise BadRequest(f"Content-Type {media!r} is not {CONTENT_TYPE}", field="Content-Type")
    with state.uploads.slot():
        ack = await state.store.slabs.receive(
            sup, upload_body(request, state.settings.upload_idle_timeout),
            request.content_length)
    if ack.new:
        state.metrics.received_bytes.inc(ack.size)
        state.metrics.received_partials.inc()
    state.store.touch(sup)
    return web.json_response(ack.to_json(), status=201 if ack.new else 200)


async def get_shard(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    interval = Interval.parse(request.query.get("start"), request.query.get("end"))
    key_from, key_to = _key(request, "keyFrom"), _key(request, "keyTo")
    if key_from is not None and key_to is not None and key_from >= key_to:
        raise BadRequest("keyFrom must be below keyTo", field="keyTo")
    with state.downloads.slot():
        read, slabs = await state.store.slabs.shard(sup, interval.start, interval.end,
                                                    key_from, key_to)
        try:
            state.store.touch(sup)
            response = web.StreamResponse(status=200, headers={
                "Content-Type": ARROW_STREAM, ROWS_HEADER: str(read.rows),
                SLABS_HEADER: str(slabs)})
            response.content_length = read.length
            out = await state.answer(request, response)
            if request.method != "HEAD" and read.parts:
                await out.ranges(read.parts)
                request[SENT_BYTES] = read.length
                state.metrics.served_bytes.labels(Served.SHARD).inc(read.length)
                state.metrics.served_requests.labels(Served.SHARD).inc()
                state.store.record_served(sup, read.length)
            await out.write_eof()
            return response
        finally:
            await state.store.run(read.close)


def install(app: web.Application, task: str) -> None:
    app.router.add_post(f"{task}/slabs", post_slab)
    app.router.add_get(f"{task}/shard", get_shard)
