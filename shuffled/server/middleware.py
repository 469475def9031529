"""Cross-cutting request handling: bearer auth, draining on shutdown, metrics timing."""

from __future__ import annotations

import asyncio
import hmac
import time

from aiohttp import web

from shuffled.errors import Overloaded, Unauthorized
from shuffled.metrics import Metrics
from shuffled.server.errors import REJECT_REASON, Handler, error_response

HEALTH_PATH = "/status/health"
METRICS_PATH = "/metrics"


def auth_middleware(token: str, metrics_require_auth: bool) -> web.middleware:
    """Require ``Authorization: Bearer <token>`` (RFC 6750) on every route but health."""
    expected = token.encode()
    open_paths = {HEALTH_PATH} | (set() if metrics_require_auth else {METRICS_PATH})

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in open_paths:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            # Constant-time comparison: no timing oracle on the token.
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                     expected):
                request[REJECT_REASON] = "unauthorized"
                response = error_response(Unauthorized("missing or wrong bearer token"))
                response.headers["WWW-Authenticate"] = 'Bearer realm="shuffled"'
                return response
        return await handler(request)

    return middleware


class Drain:
    """Tracks requests in flight; once draining, new requests get 503 + Retry-After."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle: asyncio.Event | None = None

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight (True) or ``timeout`` passes (False)."""
        if self.in_flight == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.draining and request.path != HEALTH_PATH:
            request[REJECT_REASON] = "draining"
            return error_response(Overloaded("the daemon is shutting down; retry on another "
                                             "daemon or after restart", retry_after=5))
        self.in_flight += 1
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()


def metrics_middleware(metrics: Metrics) -> web.middleware:
    """Latency by route template (never the raw path: unbounded), status, rejections."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            metrics.latency.labels(route, request.method).observe(time.perf_counter() - started)
            metrics.requests.labels(route, request.method, str(status)).inc()
            reason = request.get(REJECT_REASON)
            if reason is not None:
                metrics.rejected.labels(reason).inc()

    return middleware
