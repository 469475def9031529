"""The aiohttp application factory: routes, middlewares, lifecycle (store open/close)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry

from shuffled.cleanup import Sweeper
from shuffled.cleanup.scheduler import sweeper_ctx
from shuffled.config import Settings
from shuffled.metrics import Cut, Metrics, StoreCollector
from shuffled.protocol import API_PREFIX
from shuffled.server.errors import error_middleware
from shuffled.server.limits import Held, Limiter
from shuffled.server.access.rights import Access, access_middleware
from shuffled.server.middleware import (
    Drain, add_request_id, metrics_middleware, single_valued_query,
)
from shuffled.server.state import STATE, DaemonState
from shuffled.server.waiters import TaskWatch
from shuffled.server.routes import (
    bulk, heartbeat, lost, pages, partials, partitions, peers, slabs, status, tasks, ui,
)
from shuffled.storage import Store

CleanupCtx = Callable[[web.Application], AsyncIterator[None]]


def make_app(settings: Settings, *, registry: CollectorRegistry | None = None,
             clock: Callable[[], float] = time.time,
             extra_cleanup_ctx: tuple[CleanupCtx, ...] = ()) -> web.Application:
    """Build the daemon's app. ``registry`` defaults to prometheus_client's global one
    (with process metrics); tests inject their own. ``clock`` drives expiry."""
    registry = REGISTRY if registry is None else registry
    metrics = Metrics(registry)
    store = Store(settings, clock=clock)
    uploads = Limiter("uploads", settings.max_concurrent_uploads)
    downloads = Limiter("downloads", settings.max_concurrent_downloads)
    held = Held("partial segments", "max_held_partials", settings.max_held_partials)
    drain = Drain()
    registry.register(StoreCollector(
        store, lambda: {"uploads": uploads.active, "downloads": downloads.active},
        lambda: held.used))

    middlewares = [metrics_middleware(metrics), drain.middleware]
    if settings.auth_token or settings.signing_secrets:
        access = Access(settings.auth_token, settings.signing_secrets)
        middlewares.append(access_middleware(access, settings.metrics_require_auth))
    middlewares.append(error_middleware(
        metrics.connections_cut.labels(Cut.ERROR_AFTER_HEADERS).inc))
    middlewares.append(single_valued_query)  # inside the error middleware: a JSON 400
    # Uploads stream to disk; client_max_size only bounds bodies read whole (none here).
    app = web.Application(middlewares=middlewares, client_max_size=1 << 20)
    app.on_response_prepare.append(add_request_id)
    sweeper = Sweeper.from_settings(store, settings, metrics)
    app[STATE] = DaemonState(settings=settings, store=store, metrics=metrics, uploads=uploads,
                             downloads=downloads, held_partials=held, drain=drain,
                             sweeper=sweeper)

    sup = r"{sup}"
    task = f"{API_PREFIX}/tasks/{sup}"
    app.router.add_put(f"{task}/{{sub}}/partition", partials.put_partial)
    app.router.add_post(f"{task}/partials", bulk.post_partials)
    app.router.add_post(f"{task}/partitions", partitions.read_partitions)
    app.router.add_get(f"{task}/{{sub}}/partition", partials.get_partial)
    app.router.add_get(f"{task}/partition", partitions.get_partition)
    app.router.add_get(f"{API_PREFIX}/tasks", tasks.list_tasks)
    app.router.add_get(task, tasks.get_task)
    app.router.add_delete(task, tasks.delete_task)
    app.router.add_post(f"{task}/heartbeat", heartbeat.heartbeat)
    watch = TaskWatch(settings.long_poll_waiters)
    store.listeners.append(watch.notify)
    drain.on_drain.append(watch.wake_all)
    metrics.long_poll_waiters.set_function(lambda: watch.waiting)
    pages.install(app, task, watch)
    slabs.install(app, task)  # slabs in, shards out (docs/slab.md)
    lost.install(app, task)  # the driver's lost-daemon verdicts (PUT/GET .../lost)
    # A lost peer's share from deep storage: the read routes under /peers/{instance}.
    peers.install(app, task, {
        ("POST", "/partitions"): partitions.read_partitions,
        ("POST", "/shards"): slabs.post_shards,  # the late plan's shard reads (slabs)
        ("GET", "/partition"): partitions.get_partition,
        ("GET", "/{sub}/partition"): partials.get_partial,
        ("GET", "/partition/pages"): pages.get_pages,
        ("DELETE", "/partition/pages"): pages.ack_pages,  # a reader's acknowledge
        ("POST", "/warm"): peers.warm,  # fetch the share now: the driver declared it lost
    })
    app.router.add_get("/status/health", status.health)
    app.router.add_get("/status", status.status)
    app.router.add_get("/metrics", status.metrics)
    app.router.add_get("/ui", ui.page)  # the status page; same auth as /status
    app.router.add_get("/", ui.page)

    metrics.export_routes([(r.resource.canonical, r.method) for r in app.router.routes()
                           if r.resource is not None])

    async def store_ctx(app: web.Application) -> AsyncIterator[None]:
        await store.open()
        yield
        background = app[STATE].background  # warm-ups still fetching: the store closes
        for task in background:
            task.cancel()
        if background:
            await asyncio.wait(list(background), timeout=30)
        await store.close()

    app.cleanup_ctx.append(store_ctx)
    # After store_ctx: sweeps start once the store is open and stop before it closes.
    app.cleanup_ctx.append(sweeper_ctx(sweeper, settings.sweep_period))
    app.cleanup_ctx.extend(extra_cleanup_ctx)
    return app
