"""Slabs (docs/slab.md): ``POST /tasks/{sup}/slabs`` stores one phase-1 flush as it came;
``GET /tasks/{sup}/shard`` answers one shard of one time chunk of a sealed task, from every
slab of its sealed subtasks, as ONE Arrow IPC stream (whole batches by sendfile, the edge
batches trimmed to the shard's keys).

A shard is named by its chunk (``start``, ``end``) and its keys, ``[keyFrom, keyTo)`` in
hex (either may be left out: unbounded). ``X-Shuffled-Rows`` says the rows sent and
``X-Shuffled-Slabs`` how many slabs of the sealed subtasks this daemon holds for the task,
so that a reader can tell a daemon that lost a slab from one that has no rows for it.
``POST /tasks/{sup}/shards`` reads up to 1,000 shards in one answer, framed
(:mod:`shuffled.slab.frames`); under ``/peers/{instance}`` it answers from the slabs that
daemon offloaded to deep storage (docs/deep-storage.md), as that daemon would have.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aiohttp import web

from shuffled.errors import BadRequest
from shuffled.metrics import Served
from shuffled.protocol import ARROW_STREAM, ROWS_HEADER, Interval, validate_id
from shuffled.server.middleware import SENT_BYTES
from shuffled.server.state import state_of
from shuffled.server.streaming.bodies import read_json, refuse_encoded, upload_body
from shuffled.slab import frames
from shuffled.slab.wire import CONTENT_TYPE
from shuffled.storage.slabs import shards as shard_reads

SLABS_HEADER = "X-Shuffled-Slabs"
MAX_KEY = 4096  # bytes of a shard bound
GROUP = 64  # shards of a batched read prepared at a time


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


def _wanted(body: Any) -> list[tuple[int, int, bytes | None, bytes | None]]:
    items = body.get("shards") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        raise BadRequest('the body must be {"shards": [...]} with at least one shard',
                         field="shards")
    if len(items) > frames.MAX_SHARDS:
        raise BadRequest(f"{len(items)} shards asked for; at most {frames.MAX_SHARDS} per "
                         "request", field="shards")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"shards[{i}] is not an object", field="shards")
        try:
            interval = Interval.parse(item.get("start"), item.get("end"))
            bounds = [_hex(item.get(name), name) for name in ("keyFrom", "keyTo")]
        except BadRequest as exc:
            raise BadRequest(f"shards[{i}]: {exc.message}", **exc.details) from exc
        if bounds[0] is not None and bounds[1] is not None and bounds[0] >= bounds[1]:
            raise BadRequest(f"shards[{i}]: keyFrom must be below keyTo", field="keyTo")
        out.append((interval.start, interval.end, bounds[0], bounds[1]))
    return out


#: Sealed subtasks a read may leave out: more than a task has (one per phase-1 attempt
#: that committed) would be no task's.
MAX_WITHOUT = 100_000


def _without(body: dict[str, Any]) -> frozenset[str]:
    """``"without"``: sealed subtasks the reader leaves out (a supervisor recomputed them
    elsewhere after a daemon was lost; docs/slab.md, "A lost daemon")."""
    items = body.get("without", [])
    if (not isinstance(items, list) or len(items) > MAX_WITHOUT
            or not all(isinstance(x, str) for x in items)):
        raise BadRequest(f"without is a list of at most {MAX_WITHOUT} subtask ids",
                         field="without")
    return frozenset(validate_id(x, "without") for x in items)


def _hex(value: Any, name: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 2 * MAX_KEY:
        raise BadRequest(f"{name} is a key in hex of at most {MAX_KEY} bytes", field=name)
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise BadRequest(f"{name} is a key in hex; got {value[:64]!r}", field=name) from None


async def post_shards(request: web.Request) -> web.StreamResponse:
    """Many shards of one sealed task in one answer (:mod:`shuffled.slab.frames`), read in
    groups of :data:`GROUP` so that the edge batches trimmed are held a group at a time."""
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    try:
        body = await read_json(request, state.settings.upload_idle_timeout)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}", field="shards") from exc
    wanted = _wanted(body)
    trim = body.get("trim", True)
    if not isinstance(trim, bool):
        raise BadRequest("trim is true (the daemon trims the edge batches to each shard's "
                         "keys) or false (it sends them whole: the reader trims)", field="trim")
    without = _without(body)
    instance = request.match_info.get("instance")  # a lost peer's share (routes.peers)
    # Its own slabs are not evicted while it reads them (a peer's cache never is).
    reading = (state.store.slabs.reading(sup) if instance is None
               else contextlib.nullcontext())
    with state.downloads.slot(), reading:
        if instance is None:
            ti = await state.store.slabs.task_index(sup, without)
        else:  # a CorruptData of the copy answers 502 bad_tier_copy (routes.peers)
            ti = await state.store.peer_shard_index(sup, instance, without)
        state.store.touch(sup)
        response = web.StreamResponse(status=200, headers={
            "Content-Type": frames.MEDIA_TYPE, SLABS_HEADER: str(ti.slabs)})
        opened: dict[int, Any] = {}
        sent = 0
        try:
            # Untrimmed (what Spark's reader asks), every shard is file ranges and frame
            # heads: planned at once, the answer has a Content-Length, so the client
            # reads it without chunk framing, long runs go by sendfile, and a slab that
            # cannot be read answers an error instead of a cut. Trimmed, the edge batches
            # are decoded and held a group at a time, so the answer is chunked.
            planned: list[shard_reads.ShardRead] | None = None
            if not trim:
                planned = await state.store.run(shard_reads.read_many, ti, wanted, opened,
                                                False)
                response.content_length = sum(
                    frames.SHARD.size + r.length for r in planned) + frames.END.size
            out = await state.answer(request, response)
            for at in range(0, len(wanted), GROUP):
                reads = (planned[at: at + GROUP] if planned is not None else
                         await state.store.run(shard_reads.read_many, ti,
                                               wanted[at: at + GROUP], opened, trim))
                parts: list[Any] = []
                for read in reads:
                    parts.append(frames.shard_head(read.length, read.rows))
                    parts.extend(read.parts)
                    sent += read.length
                await out.ranges(parts)
            await out.ranges([frames.end(len(wanted))])
            request[SENT_BYTES] = sent
            state.metrics.served_bytes.labels(Served.SHARD).inc(sent)
            state.metrics.served_requests.labels(Served.SHARD).inc()
            state.store.record_served(sup, sent)
            await out.write_eof()
            return response
        finally:
            await state.store.run(_close_all, list(opened.values()))


def _close_all(files: list[Any]) -> None:
    for f in files:
        f.close()


def install(app: web.Application, task: str) -> None:
    app.router.add_post(f"{task}/slabs", post_slab)
    app.router.add_get(f"{task}/shard", get_shard)
    app.router.add_post(f"{task}/shards", post_shards)
