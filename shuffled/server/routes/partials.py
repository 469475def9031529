"""Thin HTTP handlers: parse and validate, call the store, shape the answer.

Errors are raised as domain exceptions; :mod:`shuffled.server.errors` maps them.
"""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shuffled import __version__
from shuffled.errors import BadRequest, NotFound
from shuffled.metrics import Served
from shuffled.protocol import (
    ARROW_STREAM, CONTENT_DIGEST, GENERATION_HEADER, REPR_DIGEST, ROWS_HEADER, Interval,
    PartialKey, PartitionKey, format_crc32c, parse_crc32c, parse_partition_id, validate_id,
)
from shuffled.server.streaming.bodies import refuse_encoded, upload_body
from shuffled.server.middleware import SENT_BYTES
from shuffled.server.routes.peers import reads_of
from shuffled.server.streaming.ranges import if_range_allows, parse_range
from shuffled.server.state import state_of
from shuffled.server.routes.views import disk_usages, task_detail, task_summary
from shuffled.storage import EOS, Reencoder, byte_range, fast_plan, unified_schema

ACCEPTED_TYPES = (ARROW_STREAM, "application/octet-stream", "")
PARTIALS_HEADER = "X-Shuffled-Partials"


def _partition_key(request: web.Request) -> PartitionKey:
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    interval = Interval.parse(request.query.get("start"), request.query.get("end"))
    return PartitionKey(sup, interval, parse_partition_id(request.query.get("partitionId")))


def _partial_key(request: web.Request) -> PartialKey:
    part = _partition_key(request)
    sub = validate_id(request.match_info["sub"], "subTaskId")
    return PartialKey(part.supervisor_task_id, sub, part.interval, part.partition_id)


async def put_partial(request: web.Request) -> web.Response:
    state = state_of(request)
    key = _partial_key(request)
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
    key = _partial_key(request)
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


async def get_partition(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    key = _partition_key(request)
    subs = request.query.getall("subTaskId", None)
    if subs is not None:
        subs = [validate_id(s, "subTaskId") for s in subs]
    with state.downloads.slot():
        reads = reads_of(request)
        metas = reads.partition(key, subs)
        files = await reads.open_many(metas)
        try:
            state.store.touch(key.supervisor_task_id)
            plan = fast_plan(metas)
            headers = {"Content-Type": ARROW_STREAM, PARTIALS_HEADER: str(len(metas))}
            if plan is not None:
                headers[ROWS_HEADER] = str(plan.rows)
                headers[CONTENT_DIGEST] = format_crc32c(plan.crc)
                response = web.StreamResponse(headers=headers)
                response.content_length = plan.length
                out = await state.answer(request, response)
                sent = 0
                if request.method != "HEAD":
                    await out.ranges([(files[p.file], p.offset, p.length)
                                      for p in plan.pieces])
                    await out.write(EOS)
                    sent = plan.length
            else:
                schema = await state.store.run(unified_schema, files, metas)
                headers[ROWS_HEADER] = str(sum(m.rows for m in metas))
                response = web.StreamResponse(headers=headers)
                response.enable_chunked_encoding()
                out = await state.answer(request, response)
                sent = 0
                if request.method != "HEAD":
                    encoder = Reencoder(metas, schema)
                    while (data := await state.store.run(encoder.next)) is not None:
                        await out.write(data)
                        sent += len(data)
            await out.write_eof()
            if request.method != "HEAD":
                request[SENT_BYTES] = sent
                state.metrics.served_bytes.labels(Served.PARTITION).inc(sent)
                state.metrics.served_requests.labels(Served.PARTITION).inc()
                state.store.record_served(key.supervisor_task_id, sent)
            return response
        finally:
            for fh in files:
                fh.close()


async def list_tasks(request: web.Request) -> web.Response:
    state = state_of(request)
    tasks = sorted(state.store.tasks(), key=lambda t: t.supervisor_task_id)
    return web.json_response({
        "tasks": [task_summary(t, state.settings.expiry_timeout) for t in tasks],
        "bytes": sum(t.bytes for t in tasks),
        "files": sum(t.files for t in tasks),
    })


UNPAGED_MAX = 10_000  # partials a task listing answers without ?limit
PAGE_MAX = 10_000  # the largest ?limit


def _limit(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdecimal() or not 1 <= int(value[:6]) <= PAGE_MAX:
        raise BadRequest(f"limit {value[:16]!r} is not an integer from 1 to {PAGE_MAX}",
                         field="limit")
    return int(value)


async def get_task(request: web.Request) -> web.Response:
    """A task's figures and partitions, paged by ``limit`` (partials per page, in start,
    end, partitionId, subTaskId order) and ``cursor`` (the previous page's nextCursor)."""
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    limit = _limit(request.query.get("limit"))
    cursor = request.query.get("cursor")
    entry = state.store.task(sup)
    if entry is None:
        raise NotFound(f"supervisor task {sup} holds no data here", supervisorTaskId=sup)
    if limit is None:
        if cursor is not None:
            raise BadRequest("cursor goes with limit", field="limit")
        if entry.files > UNPAGED_MAX:
            raise BadRequest(
                f"supervisor task {sup} holds {entry.files} partial segments, more than one "
                f"answer lists ({UNPAGED_MAX}): page through them with ?limit=N (up to "
                f"{PAGE_MAX}) and then ?cursor=<nextCursor>", field="limit", files=entry.files)
        limit = UNPAGED_MAX
    metas, next_cursor = state.store.page(sup, cursor, limit)
    return web.json_response(task_detail(entry, state.settings.expiry_timeout,
                                         state.store.locations, metas, next_cursor))


async def delete_task(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    state.store.mark_deleted(sup)  # paged reads answer "failed" from now on, never "empty"
    # The supervisor ends the task: every daemon's copy in deep storage goes too, a lost
    # peer's included (an expiry removes only this daemon's).
    removed = await state.store.delete_task(sup, everyone=True)
    if removed is not None:
        state.metrics.deleted_tasks.labels("request").inc()
        state.metrics.deleted_bytes.labels("request").inc(removed.bytes)
    return web.json_response({
        "supervisorTaskId": sup, "deleted": removed is not None,
        "bytes": removed.bytes if removed else 0, "files": removed.files if removed else 0,
    })


async def health(request: web.Request) -> web.Response:
    return web.json_response(True)


async def status(request: web.Request) -> web.Response:
    state = state_of(request)
    store = state.store

    usages = await store.run(disk_usages, store.locations)
    locations = [{
        "path": str(loc.path), "usedBytes": loc.used_bytes, "files": loc.files,
        "maxBytes": loc.max_bytes, "reserveBytes": loc.reserve_bytes,
        "fileSystemBytes": total, "freeBytes": free, "healthy": loc.healthy,
        "lastError": loc.last_error,
    } for loc, (total, free) in zip(store.locations, usages)]

    tasks = store.tasks()
    return web.json_response({
        "version": __version__,
        "uptimeSeconds": round(time.time() - state.started, 3),
        "draining": state.drain.draining,
        "tasks": len(tasks),
        "files": sum(t.files for t in tasks),
        "bytes": sum(t.bytes for t in tasks),
        "inFlight": {"uploads": state.uploads.active, "downloads": state.downloads.active},
        "locations": locations,
    })


async def metrics(request: web.Request) -> web.Response:
    state = state_of(request)
    body = generate_latest(state.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
