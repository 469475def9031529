"""Running the daemon: bind, announce, drain on SIGTERM, stop cleanly."""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from shuffled.config import Settings
from shuffled.errors import ConfigError
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


def _bind_error(exc: OSError, host: str, port: int) -> ConfigError:
    """The setting to change when binding ``host:port`` failed, and how."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            f"port: {where} is already in use (another shuffled, or another program, listens "
            f"there); choose a free --port (SHUFFLED_PORT) or stop what listens there",
            setting="port")
    if exc.errno in (errno.EACCES, errno.EPERM) and 0 < port < 1024:
        return ConfigError(
            f"port: {port} is a privileged port (below 1024): listening there needs root or "
            f"CAP_NET_BIND_SERVICE; choose --port 1024 or above (the default is 8091)",
            setting="port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(
            f"host: {host} is not an address of this machine; give --host one of its "
            f"addresses (127.0.0.1, or 0.0.0.0 for every interface)", setting="host")
    return ConfigError(f"host: cannot listen on {where}: {exc.strerror or exc}; check --host "
                       f"and --port", setting="host")


def listen_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound sockets for every address ``host`` resolves to (one port for all, even for
    port 0); raises :class:`ConfigError` naming the setting to change."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"host: {host!r} does not resolve ({exc.strerror}); give --host an "
                          f"address or a name of this machine", setting="host") from exc
    sockets: list[socket.socket] = []
    seen: set[Any] = set()
    try:
        for family, kind, proto, _, addr in infos:
            if addr in seen:
                continue
            seen.add(addr)
            if sockets and port == 0:  # the port the first address got, for every one
                addr = (addr[0], sockets[0].getsockname()[1], *addr[2:])
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise _bind_error(exc, host, port) from exc
    return sockets


async def serve(settings: Settings, *, registry: CollectorRegistry | None = None,
                ready: Callable[[str], None] | None = None,
                stop: asyncio.Event | None = None,
                clock: Callable[[], float] | None = None) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT in the main thread), then drain:
    new requests get 503 + Retry-After while in-flight ones finish, up to
    ``shutdown_timeout``."""
    raise_open_file_limit()
    # Bound before the app starts: a port in use is then one ConfigError, with no location
    # locked, no store opened and no scheduler started (nor logging) before it.
    sockets = listen_sockets(settings.host, settings.port)
    try:
        app = make_app(settings, registry=registry,
                       clock=time.time if clock is None else clock)
        # aiohttp's keep-alive timer runs from a connection's start and from each answer
        # until a whole request head arrives, and is not reset by a partial one: it is
        # the request-head timeout (idle and slowloris connections are closed).
        runner = web.AppRunner(app, handle_signals=False,
                               access_log=access_log if settings.access_log else None,
                               access_log_class=AccessLog,
                               shutdown_timeout=settings.shutdown_timeout,
                               keepalive_timeout=settings.request_head_timeout)
        await runner.setup()
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    stop = stop or asyncio.Event()
    try:
        tls = ssl_context(settings)
        for sock in sockets:
            await web.SockSite(runner, sock, ssl_context=tls).start()
        host, port = sockets[0].getsockname()[:2]
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
        drain.start()
        log.info("draining: %d requests in flight", drain.in_flight)
        if not await drain.wait_idle(settings.shutdown_timeout):
            log.warning("shutdown timeout: %d requests still in flight", drain.in_flight)
    finally:
        await runner.cleanup()
