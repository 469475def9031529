"""Supervisor tasks on a daemon: listing them, a task's partitions page by page, deleting one."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterable, Iterator
from typing import Any

from shuffled.client.answers import BadResponse, json_dict, read_json
from shuffled.client.http import Request, Transport
from shuffled.protocol import task_path


def list_tasks(http_: Transport) -> dict[str, Any]:
    """``GET /tasks``: the supervisor tasks held here with bytes, files, expiry."""
    value = http_.request(Request("GET", task_path(), handle=read_json, what="list tasks"))
    if isinstance(value, list):
        return {"tasks": value}
    if not isinstance(value, dict):
        raise BadResponse(f"GET /tasks: expected a JSON object, got {type(value).__name__}")
    return value


def task_pages(http_: Transport, supervisor_task_id: str, *, page_size: int,
               ) -> Iterator[dict[str, Any]]:
    """``GET /tasks/{id}?limit=..&cursor=..`` page after page (nothing if not held)."""
    what = f"task {supervisor_task_id}"

    def handle(resp: http.client.HTTPResponse) -> dict[str, Any] | None:
        if resp.status == 404:
            resp.read()
            return None
        return json_dict(resp)

    cursor: str | None = None
    while True:
        query = [("limit", str(page_size))] + ([("cursor", cursor)] if cursor else [])
        page = http_.request(Request("GET", task_path(supervisor_task_id), query=query,
                                     handle=handle, what=what, accept=(404,)))
        if page is None:
            return
        yield page
        cursor = page.get("nextCursor")
        if not cursor:  # the last page (or a daemon that does not page)
            return


def joined(pages: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The pages of one task's listing as one (a partition cut by a page's end is joined
    again); None if there were none (the task is not held)."""
    whole: dict[str, Any] | None = None
    for page in pages:
        if whole is None:
            whole = page
            continue
        parts = page.get("partitions", [])
        last = whole["partitions"][-1] if whole["partitions"] else None
        if parts and last is not None and all(
                parts[0].get(f) == last.get(f) for f in ("start", "end", "partitionId")):
            first = parts.pop(0)
            last["subTasks"].extend(first.get("subTasks", []))
            last["bytes"] = last.get("bytes", 0) + first.get("bytes", 0)
            last["rows"] = last.get("rows", 0) + first.get("rows", 0)
        whole["partitions"].extend(parts)
    if whole is not None and "nextCursor" in whole:
        whole["nextCursor"] = None  # joined: nothing more to ask
    return whole


def delete_task(http_: Transport, supervisor_task_id: str) -> dict[str, Any]:
    """``DELETE /tasks/{id}``: remove all of that task's data. Idempotent (unknown id is
    fine). The answer: ``deleted`` (whether anything was held), ``bytes``, ``files``."""

    def handle(resp: http.client.HTTPResponse) -> dict[str, Any]:
        body = resp.read()
        try:
            answer = json.loads(body) if resp.status == 200 else {}
        except ValueError:
            answer = {}
        return answer if isinstance(answer, dict) else {}

    return http_.request(Request("DELETE", task_path(supervisor_task_id), handle=handle,
                                 what=f"delete task {supervisor_task_id}", accept=(404,)))
