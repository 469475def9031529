"""The driver's verdict on lost daemons, relayed to phase 2 (``.../tasks/{sup}/lost``).

``PUT /druid/worker/v1/shuffle/tasks/{sup}/lost`` with ``{"lost": ["http://host:port",
...]}``: the supervisor (the Spark driver) declared these daemons of its task lost (its
heartbeats found them gone, docs/failover.md) and tells every surviving daemon. The
addresses are added to what the daemon keeps for the task (idempotent: the same PUT again
changes nothing, ``new`` false); kept in memory only, bounded in bytes
(``max_lost_marks_bytes``: 503 past it) and forgotten after the expiry timeout
(:mod:`shuffled.storage.tasks.verdicts`). It is taken for a task this daemon holds nothing of
yet: the driver tells every survivor as soon as it declares a daemon lost, before phase 1
may have reached them, and their readers must find the verdict when they come (a 404
would be taken by the driver for "told").

``GET`` of the same path answers the addresses declared lost so far (empty if none). A
merge task whose reads from a daemon fail asks a survivor this between its retries, and
gives up on that daemon at once when it is named: its partitions are reported lost and the
driver recomputes them, instead of the task retrying for ``shuffleRetrySeconds``.

Both go through the auth middleware like every data route (one shared bearer token
today). With scoped tokens the PUT is a driver right (``admin``, like seal, fail, DELETE
and heartbeat) and the GET a reader's right (``read``, as phase 2's merge tasks hold).
"""

from __future__ import annotations

import re

from aiohttp import web

from shuffled.errors import InvalidBody
from shuffled.protocol import validate_id
from shuffled.server.streaming.bodies import read_json
from shuffled.server.state import state_of
from shuffled.storage import MAX_LOST

# A daemon's address as the driver names it: its base URL.
_ADDRESS = re.compile(r"https?://[!-~]{1,500}")


def _addresses(body: object) -> list[str]:
    lost = body.get("lost") if isinstance(body, dict) else None
    if (not isinstance(lost, list) or len(lost) > MAX_LOST
            or not all(isinstance(a, str) and _ADDRESS.fullmatch(a) for a in lost)):
        raise InvalidBody('the body must be JSON {"lost": [daemon base URLs...]} with at most '
                          f"{MAX_LOST} http(s) URLs of at most 507 characters")
    return lost


async def put_lost(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    try:
        body = await read_json(request, state.settings.upload_idle_timeout)
    except ValueError:
        raise InvalidBody('the body must be JSON {"lost": [daemon base URLs...]}') from None
    lost, new = state.store.verdicts.declare(sup, _addresses(body))
    return web.json_response({"supervisorTaskId": sup, "lost": sorted(lost), "new": new})


async def get_lost(request: web.Request) -> web.Response:
    state = state_of(request)
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    return web.json_response({"supervisorTaskId": sup,
                              "lost": sorted(state.store.verdicts.lost(sup))})


def install(app: web.Application, task: str) -> None:
    """Add the routes under ``task`` (the task path template)."""
    app.router.add_put(f"{task}/lost", put_lost)
    app.router.add_get(f"{task}/lost", get_lost)
