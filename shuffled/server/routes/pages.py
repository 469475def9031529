"""Paged partition reads, seals, failed tasks and task-state polls (Presto's data plane).

``GET  .../tasks/{sup}/partition/pages?start&end&partitionId&token[&maxBytes][&maxWait]
[&subTaskId...]`` answers the page at ``token`` (:mod:`.pageplan`) with the headers of
:mod:`shuffled.protocol` (this token, the next, complete, bytes pending, task state). The
daemon keeps no per-reader state: a token is a position in the partition's commit order,
so asking again with the same token returns the same bytes, and ``DELETE`` of a token
(Presto's acknowledge) only records that the reader is done with it. The data stays until
the supervisor's DELETE, deliberately unlike Presto's delete-on-ack: a failed phase-2
task must be able to read the partition again.

A partition is complete once its task is sealed (``PUT .../tasks/{sup}/seal``) and the
reader has passed every partial of the sealed subtasks in it. Before the seal, every
partial held is served and complete is false. A task marked failed (``POST .../fail`` or
its DELETE) answers every page empty, complete=false, after ``failed_read_delay``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from shuffled.errors import BadRequest, InvalidBody
from shuffled.protocol import (
    ARROW_STREAM, COMPLETE_HEADER, CONTENT_DIGEST, NEXT_TOKEN_HEADER, PAGE_TOKEN_HEADER,
    PENDING_BYTES_HEADER, TASK_STATE_HEADER, PartitionKey, TaskDataState, format_crc32c,
    validate_id,
)
from shuffled.metrics import LongPoll, Served
from shuffled.server.routes.params import partition_key, sub_task_ids
from shuffled.server.middleware import SENT_BYTES
from shuffled.server.routes.peers import Reads, reads_of
from shuffled.server.streaming.bodies import read_json
from shuffled.server.state import DaemonState, state_of
from shuffled.server.waiters import WATCH, TaskWatch
from shuffled.storage import MAX_TOKEN, SEALED_FLAG, Page, PartialMeta, page_crc, plan_page

DEFAULT_PAGE_BYTES = 8 << 20
MAX_PAGE_BYTES = 256 << 20
MAX_SEAL_IDS = 1_000_000
MAX_WAIT = 86_400  # seconds a caller may ask for; the daemon waits at most long_poll_max


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, not {raw[:32]!r}", field=name) from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be in [{low}, {high}], not {value}", field=name)
    return value


def _wait(request: web.Request, state: DaemonState) -> float:
    raw = request.query.get("maxWait")
    if raw is None:
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        raise BadRequest(f"maxWait must be seconds, not {raw[:32]!r}", field="maxWait") from None
    if not 0 <= seconds <= MAX_WAIT:  # also refuses NaN
        raise BadRequest(f"maxWait must be in [0, {MAX_WAIT}] seconds", field="maxWait")
    return min(seconds, state.settings.long_poll_max)




async def _plan(state: DaemonState, reads: Reads, key: PartitionKey, subs: list[str] | None, token: int,
                max_bytes: int) -> tuple[Page, list[PartialMeta], bool]:
    """The page at ``token`` (ReadAgain if the seal left out what it passed), its partials
    and whether the partition is complete with it; past the seal, the next token carries
    SEALED_FLAG."""
    metas, held_back, sealed = reads.view(key, subs, token)
    await reads.localize(metas)
    try:
        page = await state.store.run(plan_page, metas, token, max_bytes)
    except FileNotFoundError:
        # A pack no longer local: read back from deep storage if it was offloaded (else
        # deleted meanwhile, as before).
        if not await reads.localize(metas, missing=True):
            raise
        page = await state.store.run(plan_page, metas, token, max_bytes)
    if sealed and page.next_token:  # 0 stays 0: the start is the start
        page.next_token |= SEALED_FLAG
    return page, metas, sealed and page.at_end and not held_back


async def get_pages(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    watch = request.app[WATCH]
    key = partition_key(request)
    sup = key.supervisor_task_id
    token = _int(request, "token", 0, 0, MAX_TOKEN)
    max_bytes = _int(request, "maxBytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES)
    wait = _wait(request, state)
    subs = sub_task_ids(request)
    # An empty answer is an empty Arrow stream body too: no schema, no batches.
    headers = {PAGE_TOKEN_HEADER: str(token), "Content-Type": ARROW_STREAM}
    if state.store.failed(sup):
        # A read keeps a failed task held like any other: its verdict lives as long as
        # its data (a reader told "failed" before expiry is told so after it too).
        state.store.touch(sup)
        await asyncio.sleep(state.settings.failed_read_delay)
        return _failed(headers, token)
    changed = watch.event(sup)  # before looking: a commit in between still wakes us
    reads = reads_of(request)
    page, metas, complete = await _plan(state, reads, key, subs, token, max_bytes)
    if not page.batches and not complete and wait > 0:
        early = await watch.wait(changed, wait)
        state.metrics.long_polls.labels(LongPoll.EARLY if early else LongPoll.TIMEOUT).inc()
        if state.store.failed(sup):
            return _failed(headers, token)
        page, metas, complete = await _plan(state, reads, key, subs, token, max_bytes)
    headers.update({
        NEXT_TOKEN_HEADER: str(page.next_token), COMPLETE_HEADER: str(complete).lower(),
        PENDING_BYTES_HEADER: str(page.pending_bytes),
        TASK_STATE_HEADER: reads.state(sup),
    })
    if not page.batches:
        return web.Response(status=200, headers=headers)
    with state.downloads.slot():
        used = sorted({p[0] for p in page.pieces if isinstance(p, tuple)})
        opened = await reads.open_many([metas[i] for i in used])
        files = dict(zip(used, opened))
        try:
            headers[CONTENT_DIGEST] = format_crc32c(await state.store.run(page_crc, files, page))
            response = web.StreamResponse(headers=headers)
            response.content_length = page.length
            out = await state.answer(request, response)
            await out.ranges([p if isinstance(p, bytes) else (files[p[0]], p[1], p[2])
                              for p in page.pieces])
            await out.write_eof()
        finally:
            for fh in opened:
                fh.close()
    state.store.touch(sup)
    request[SENT_BYTES] = page.length
    state.metrics.served_bytes.labels(Served.PAGES).inc(page.length)
    state.metrics.served_requests.labels(Served.PAGES).inc()
    state.store.record_served(sup, page.length)
    return response


def _failed(headers: dict[str, str], token: int) -> web.Response:
    headers.update({NEXT_TOKEN_HEADER: str(token), COMPLETE_HEADER: "false",
                    PENDING_BYTES_HEADER: "0", TASK_STATE_HEADER: TaskDataState.FAILED})
    return web.Response(status=200, headers=headers)


async def ack_pages(request: web.Request) -> web.Response:
    """Presto's acknowledge: nothing is held per reader, so nothing is released; counted
    and logged (the access log names the token) so a reader's progress can be followed."""
    partition_key(request)
    _int(request, "token", 0, 0, MAX_TOKEN)
    state_of(request).metrics.page_acks.inc()
    return web.Response(status=204)


async def put_seal(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    try:
        body = await read_json(request, state.settings.upload_idle_timeout)
        subs = body["subTaskIds"]
        if not isinstance(subs, list) or len(subs) > MAX_SEAL_IDS:
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise InvalidBody('the body must be JSON {"subTaskIds": [ids...]} with at most '
                          f"{MAX_SEAL_IDS} ids") from None
    subs = [validate_id(s, "subTaskId") for s in subs]
    new = await state.store.seal(sup, subs)  # refused (409) for a failed task
    answer: dict[str, Any] = {"supervisorTaskId": sup, "sealed": True, "new": new,
                              "subTaskIds": len(set(subs))}
    deep = state.store.offload_state(sup)
    if deep is not None:  # the instance names this daemon's share in the tier
        answer["deepStorage"] = deep
    return web.json_response(answer)


async def post_fail(request: web.Request) -> web.Response:
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    await state_of(request).store.fail(sup)
    return web.json_response({"supervisorTaskId": sup, "failed": True})


def _state_body(state: DaemonState, sup: str) -> dict[str, Any]:
    entry = state.store.task(sup)
    current = state.store.state(sup)
    received = entry.received_partials if entry else 0
    deep = state.store.offload_state(sup)
    body: dict[str, Any] = {
        "supervisorTaskId": sup, "state": current,
        # changes exactly when a partial commits, the task is sealed or fails, or (with
        # deep storage) its offload ends
        "tag": f"{current}.{received}.{entry.files if entry else 0}"
               + (f".{deep['offload']}" if deep else ""),
        "partials": entry.files if entry else 0,
        "sealedSubTasks": len(state.store.seals.get(sup, ()))}
    if deep is not None:
        body["deepStorage"] = deep
    return body


async def get_state(request: web.Request) -> web.Response:
    """The task's state; with ``known=<tag>&maxWait=<s>``, answers when it differs from
    ``known`` or when the wait is over, whichever comes first."""
    state = state_of(request)
    watch = request.app[WATCH]
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    known = request.query.get("known")
    wait = _wait(request, state)
    changed = watch.event(sup)
    body = _state_body(state, sup)
    if known is not None and known == body["tag"] and wait > 0:
        early = await watch.wait(changed, wait)
        state.metrics.long_polls.labels(LongPoll.EARLY if early else LongPoll.TIMEOUT).inc()
        body = _state_body(state, sup)
    return web.Response(text=json.dumps(body), content_type="application/json")


def install(app: web.Application, task: str, watch: TaskWatch) -> None:
    """Add the routes under ``task`` (the task path template) and wire the watch."""
    app[WATCH] = watch
    app.router.add_get(f"{task}/partition/pages", get_pages)
    app.router.add_delete(f"{task}/partition/pages", ack_pages)
    app.router.add_put(f"{task}/seal", put_seal)
    app.router.add_post(f"{task}/fail", post_fail)
    app.router.add_get(f"{task}/state", get_state)
