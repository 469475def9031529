"""The supervisor's heartbeat (``POST /shuffle/v1/tasks/{sup}/heartbeat``).

A supervisor sends one to every daemon every few seconds while its ingestion runs (the
data tunnel's PING/PONG). It refreshes the task's expiry like a PUT or GET of its data, and
its answer says who answered: the daemon's ``instance`` (a new one means the daemon
restarted; it kept whatever its locations hold), whether it is ``draining`` (stopping: the
supervisor waits for it to come back before deciding its data is lost) and what it holds of
the task. A heartbeat is answered while draining, when every other request gets 503. A
daemon that does not answer at all is the supervisor's early sign of a lost daemon
(docs/failover.md).
"""

from __future__ import annotations

import time

from aiohttp import web

from shuffled.protocol import validate_id
from shuffled.server.state import state_of


async def heartbeat(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
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
        "expiresInSeconds": state.settings.expiry_timeout,
    })
