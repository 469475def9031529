"""The supervisor's (the Spark driver's) calls on a task: seal, heartbeat, fail, its state,
and the lost-daemon verdict. Scoped, they need the task's ``admin`` token (the state and
the verdict's GET: ``read``; docs/security.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shuffled.client.answers import json_dict
from shuffled.client.http import Request, Transport
from shuffled.client.retry import NO_RETRY
from shuffled.protocol import task_path, validate_id

JSON = {"Content-Type": "application/json"}


def seal(http_: Transport, supervisor_task_id: str,
         sub_task_ids: Sequence[str]) -> dict[str, Any]:
    """``PUT /tasks/{id}/seal``: exactly these subtasks of the task are committed.
    Idempotent for the same ids; Conflict for different ones or a failed task."""
    body = json.dumps({"subTaskIds": [validate_id(s, "subTaskId")
                                      for s in sub_task_ids]}).encode()
    return http_.request(Request("PUT", f"{task_path(supervisor_task_id)}/seal", body=body,
                                 headers=JSON, handle=json_dict,
                                 what=f"seal {supervisor_task_id}"))


def heartbeat(http_: Transport, supervisor_task_id: str, *,
              quota: dict[str, int] | None = None) -> dict[str, Any]:
    """``POST /tasks/{id}/heartbeat``, one try: refreshes the task's expiry; the answer
    names the daemon's ``instance`` (new after a restart), whether it is ``draining``
    and what it holds of the task (``bytes``, ``partials``, ``servedBytes``, the
    ``quota`` in force). ``quota`` (``{"bytes": N, "partials": M}``, 0: no limit) asks
    for per-task quotas tighter than the daemon's. Raises :class:`ShuffleUnavailable` at
    once when the daemon does not answer."""
    body = json.dumps({"quota": quota}).encode() if quota else None
    return http_.request(Request("POST", f"{task_path(supervisor_task_id)}/heartbeat",
                                 body=body, headers=JSON if body else None, handle=json_dict,
                                 policy=NO_RETRY, what=f"heartbeat {supervisor_task_id}"))


def fail(http_: Transport, supervisor_task_id: str) -> None:
    """``POST /tasks/{id}/fail``: paged reads of the task answer "failed" from now on, and
    it takes no more uploads."""
    http_.request(Request("POST", f"{task_path(supervisor_task_id)}/fail",
                          handle=lambda resp: resp.read(), what=f"fail {supervisor_task_id}"))


def warm(http_: Transport, supervisor_task_id: str) -> dict[str, Any]:
    """``POST /peers/<instance>/.../tasks/{id}/warm`` (the transport's base URL ends in the
    peer prefix), one try: the daemon starts fetching the peer's share of the task from
    deep storage into its cache. The answer names the packs."""
    return http_.request(Request("POST", f"{task_path(supervisor_task_id)}/warm",
                                 handle=json_dict, policy=NO_RETRY,
                                 what=f"warm {supervisor_task_id}"))


def task_state(http_: Transport, supervisor_task_id: str, *, known: str | None = None,
               max_wait: float = 0.0) -> dict[str, Any]:
    """``GET /tasks/{id}/state``: ``state`` (none, running, sealed, failed) and a ``tag``
    that changes with every commit, seal or failure. With ``known`` (a tag) and
    ``max_wait``, the daemon answers once the tag differs or the wait is over."""
    query = []
    if known is not None:
        query.append(("known", known))
    if max_wait > 0:
        query.append(("maxWait", f"{max_wait:g}"))
    return http_.request(Request("GET", f"{task_path(supervisor_task_id)}/state", query=query,
                                 handle=json_dict, what=f"state of {supervisor_task_id}"))


def declare_lost(http_: Transport, supervisor_task_id: str,
                 servers: Sequence[str]) -> dict[str, Any]:
    """``PUT /tasks/{id}/lost``, one try: the driver declared ``servers`` (base URLs) lost;
    idempotent. The answer lists every daemon declared lost for the task so far."""
    return http_.request(Request("PUT", f"{task_path(supervisor_task_id)}/lost",
                                 body=json.dumps({"lost": list(servers)}).encode(),
                                 headers=JSON, handle=json_dict, policy=NO_RETRY,
                                 what=f"declare lost for {supervisor_task_id}"))


def lost_daemons(http_: Transport, supervisor_task_id: str) -> list[str]:
    """``GET /tasks/{id}/lost``, one try: the daemons the task's driver declared lost."""
    answer = http_.request(Request("GET", f"{task_path(supervisor_task_id)}/lost",
                                   handle=json_dict, policy=NO_RETRY,
                                   what=f"lost daemons of {supervisor_task_id}"))
    return [str(s) for s in answer.get("lost", [])]
