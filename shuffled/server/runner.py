"""Running the daemon: bind, announce, drain on SIGTERM, stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import ssl
import threading
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from shuffled.config import Settings
from shuffled.server.app import make_app
from shuffled.server.middleware import AccessLog
from shuffled.server.state import STATE

log = logging.getLogger("shuffled.server")
# Its own logger so operators can route or silence the access log apart from the rest.
access_log = logging.getLogger("shuffled.access")


def raise_open_file_limit() -> None:
    """Aggregate GETs hold one descriptor per partial segment: lift the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    if not settings.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


async def serve(settings: Settings, *, registry: CollectorRegistry | None = None,
                ready: Callable[[str], None] | None = None,
                stop: asyncio.Event | None = None,
                clock: Callable[[], float] | None = None) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT in the main thread), then drain:
    new requests get 503 + Retry-After while in-flight ones finish, up to
    ``shutdown_timeout``."""
    raise_open_file_limit()
    kwargs = {"clock": clock} if clock is not None else {}
    app = make_app(settings, registry=registry, **kwargs)
    runner = web.AppRunner(app, handle_signals=False,
                           access_log=access_log if settings.access_log else None,
                           access_log_class=AccessLog,
                           shutdown_timeout=settings.shutdown_timeout)
    await runner.setup()
    stop = stop or asyncio.Event()
    try:
        tls = ssl_context(settings)
        site = web.TCPSite(runner, settings.host, settings.port, ssl_context=tls,
                           reuse_address=True)
        await site.start()
        host, port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
        scheme = "https" if tls else "http"
        shown = f"[{host}]" if ":" in host else host
        url = f"{scheme}://{shown}:{port}"
        if threading.current_thread() is threading.main_thread():
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        log.info("shuffled listening on %s", url)
        if ready is not None:
            ready(url)
        await stop.wait()
        drain = app[STATE].drain
        drain.draining = True
        log.info("draining: %d requests in flight", drain.in_flight)
        if not await drain.wait_idle(settings.shutdown_timeout):
            log.warning("shutdown timeout: %d requests still in flight", drain.in_flight)
    finally:
        await runner.cleanup()
