"""Whole partitions: the seed's aggregate GET (``GET /tasks/{sup}/partition``: every
partial of one partition as ONE Arrow IPC stream, by sendfile when their schemas agree,
re-encoded in bounded slices when not) and the bulk read.

``POST /tasks/{sup}/partitions``: many partitions of one task read with one request. Phase 2 of a Druid-shaped job reads thousands of small partitions; one aggregate GET each
costs a round trip and a handler run that outweigh the bytes. This route answers a list
of partitions (each optionally restricted to some subtasks) with one framed stream
(:mod:`shuffled.framing`, media type ``application/vnd.shuffled.partitions``): per
partition, in the order asked, a frame whose body is exactly what the aggregate GET of that
partition would send on its zero-copy path, then an END frame with the count. A partition
the zero-copy path cannot serve (schemas differ, dictionaries) gets an empty frame with
``fallback``: the client reads that one with the aggregate GET, which re-encodes. A cut
connection never ends with END, so a client never takes a partial answer for a whole one.
docs/bulk-upload.md ("Reading many partitions") has the contract.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from shuffled.errors import BadRequest
from shuffled.framing import PARTITIONS_MEDIA_TYPE, encode_end, encode_partition
from shuffled.metrics import Served
from shuffled.protocol import (
    ARROW_STREAM, CONTENT_DIGEST, ROWS_HEADER, Interval, PartitionKey, format_crc32c,
    parse_partition_id, validate_id,
)
from shuffled.server.middleware import SENT_BYTES
from shuffled.server.routes.params import partition_key, sub_task_ids
from shuffled.server.routes.peers import reads_of
from shuffled.server.streaming.sendfile import Piece
from shuffled.server.streaming.bodies import read_json
from shuffled.server.state import state_of
from shuffled.storage import EOS, FastPlan, PartialMeta, Reencoder, fast_plan, unified_schema

MAX_PARTITIONS = 1000  # per request (the body is read whole, under client_max_size)
OPEN_GROUP = 64  # partitions whose packs are open at once while answering
PARTIALS_HEADER = "X-Shuffled-Partials"


def parse_request(supervisor_task_id: str, body: Any) -> list[tuple[PartitionKey, list[str] | None]]:
    """The partitions a request body asks for; BadRequest naming the first fault."""
    items = body.get("partitions") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        raise BadRequest('the body must be {"partitions": [...]} with at least one partition',
                         field="partitions")
    if len(items) > MAX_PARTITIONS:
        raise BadRequest(f"{len(items)} partitions asked for; at most {MAX_PARTITIONS} per "
                         f"request", field="partitions")
    wanted = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"partitions[{i}] is not an object", field="partitions")
        try:
            interval = Interval.parse(item.get("start"), item.get("end"))
            pid = parse_partition_id(item.get("partitionId"))
            subs = item.get("subTaskIds")
            if subs is not None:
                if not isinstance(subs, list) or not subs:
                    raise BadRequest("subTaskIds must be a non-empty list (omit it for all)",
                                     field="subTaskIds")
                subs = [validate_id(s, "subTaskId") for s in subs]
        except BadRequest as exc:
            raise BadRequest(f"partitions[{i}]: {exc.message}", **exc.details) from exc
        wanted.append((PartitionKey(supervisor_task_id, interval, pid), subs))
    return wanted


def _frame(key: PartitionKey, metas: list[PartialMeta]) -> tuple[bytes, FastPlan | None]:
    """One partition's frame head, and the zero-copy plan of its body (None: fallback)."""
    plan = fast_plan(metas)
    if plan is None:
        reason = "schemas differ or dictionaries: read this partition with the aggregate GET"
        return encode_partition(key, 0, 0, len(metas), sum(m.rows for m in metas), reason), None
    return encode_partition(key, plan.length, plan.crc, len(metas), plan.rows), plan


async def read_partitions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    try:
        body = await read_json(request, state.settings.upload_idle_timeout)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}", field="partitions") from exc
    wanted = parse_request(sup, body)
    sent = 0
    with state.downloads.slot():
        # Every partition is looked up before the answer starts: one missing (or a subtask
        # missing from it) is a 404 for the request, as the aggregate GET answers. Its
        # frames are planned too, so the answer's length is known: large pieces go out by
        # sendfile, which bypasses chunked coding (RFC 9112 section 7.1) and so needs a
        # Content-Length.
        reads = reads_of(request)
        found = reads.partitions(sup, wanted)
        planned = [(metas, *_frame(key, metas))
                   for (key, _), metas in zip(wanted, found, strict=True)]
        end = encode_end(len(wanted))
        total = sum(len(head) + (plan.length if plan else 0) for _, head, plan in planned)
        state.store.touch(sup)
        response = web.StreamResponse(headers={"Content-Type": PARTITIONS_MEDIA_TYPE})
        response.content_length = total + len(end)
        out = await state.answer(request, response)
        for at in range(0, len(planned), OPEN_GROUP):
            group = planned[at: at + OPEN_GROUP]
            # One executor call opens every pack the group reads (mostly the same few).
            wanted_files = [m for metas, _, p in group if p for m in metas]
            files = await reads.open_many(wanted_files) if wanted_files else []
            try:
                pieces: list[Piece] = []
                first = 0
                for metas, head, plan in group:
                    pieces.append(head)
                    if plan is None:
                        continue
                    mine = files[first: first + len(metas)]
                    first += len(metas)
                    pieces += [(mine[p.file], p.offset, p.length) for p in plan.pieces]
                    pieces.append(EOS)
                    sent += plan.length
                await out.ranges(pieces)
            finally:
                for fh in {id(f): f for f in files}.values():
                    fh.close()
        await out.write(end)
    await out.write_eof()
    request[SENT_BYTES] = sent
    state.metrics.served_bytes.labels(Served.PARTITION).inc(sent)
    state.metrics.served_requests.labels(Served.PARTITION).inc(len(wanted))
    state.store.record_served(sup, sent)
    return response


async def get_partition(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    key = partition_key(request)
    subs = sub_task_ids(request)
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
