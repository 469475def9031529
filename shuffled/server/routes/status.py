"""The daemon's own state: liveness (``/status/health``), its figures (``/status``) and
Prometheus' scrape (``/metrics``)."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shuffled import __version__
from shuffled.server.routes.views import disk_usages
from shuffled.server.state import state_of


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
