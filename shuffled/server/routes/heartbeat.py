"""The supervisor's heartbeat (``POST /shuffle/v1/tasks/{sup}/heartbeat``).

A supervisor sends one to every daemon every few seconds while its ingestion runs (the
data tunnel's PING/PONG). It refreshes the task's expiry like a PUT or GET of its data, and
its answer says who answered: the daemon's ``instance`` (a new one means the daemon
restarted; it kept whatever its locations hold), whether it is ``draining`` (stopping: the
supervisor waits for it to come back before deciding its data is lost) and what it holds of
the task, against its quota. Its optional JSON body ``{"quota": {"bytes": N, "partials":
M}}`` asks for tighter per-task quotas than the operator's (the spec's ``tuningConfig``
``shuffleQuotaBytes``/``shuffleQuotaPartials``; :mod:`shuffled.storage.write.admission`). A
heartbeat is answered while draining, when every other request gets 503. A
daemon that does not answer at all is the supervisor's early sign of a lost daemon
(docs/failover.md).
"""

from __future__ import annotations

import time

from aiohttp import web

from shuffled.errors import InvalidBody
from shuffled.protocol import validate_id
from shuffled.server.streaming.bodies import read_json
from shuffled.server.state import state_of
from shuffled.storage import Quota

MAX_QUOTA = 1 << 62


async def _asked(request: web.Request, idle: float) -> Quota | None:
    if not request.body_exists:
        return None
    try:
        body = await read_json(request, idle)
        if not isinstance(body, dict) or set(body) - {"quota"}:
            raise ValueError
        if "quota" not in body:
            return None
        asked = body["quota"]
        if not isinstance(asked, dict):
            raise ValueError
        values = [asked.get("bytes", 0), asked.get("partials", 0)]
        if not all(type(v) is int and 0 <= v <= MAX_QUOTA for v in values) or \
                set(asked) - {"bytes", "partials"}:
            raise ValueError
        quota = Quota(*values)
    except (ValueError, TypeError, AttributeError):
        raise InvalidBody('a heartbeat body is JSON {"quota": {"bytes": N, "partials": M}} '
                          "with non-negative integers (0: no limit)") from None
    return quota


async def heartbeat(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    asked = await _asked(request, state.settings.upload_idle_timeout)
    quota = (state.store.admission.ask(sup, asked) if asked is not None
             else state.store.admission.of(sup))
    state.store.touch(sup)
    entry = state.store.task(sup)
    return web.json_response({
        "supervisorTaskId": sup,
        "instance": state.instance,
        "uptimeSeconds": round(time.time() - state.started, 3),
        "draining": state.drain.draining,
        "held": entry is not None,
        "bytes": entry.bytes if entry else 0,
        "partials": entry.files if entry else 0,
        "servedBytes": entry.served_bytes if entry else 0,
        "quota": {"bytes": quota.bytes, "partials": quota.partials},
        "expiresInSeconds": state.settings.expiry_timeout,
    })
