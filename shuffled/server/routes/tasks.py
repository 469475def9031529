"""The task listing and a task's figures (``GET /tasks``, ``GET /tasks/{sup}``, paged
by ``limit`` and ``cursor``) and its removal (``DELETE /tasks/{sup}``)."""

from __future__ import annotations

from aiohttp import web

from shuffled.errors import BadRequest, NotFound
from shuffled.protocol import validate_id
from shuffled.server.routes.views import task_detail, task_summary
from shuffled.server.state import state_of


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
