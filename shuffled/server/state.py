"""What handlers share, stored once on the app (no module globals)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from shuffled.cleanup import Sweeper
from shuffled.config import Settings
from shuffled.metrics import Cut, Metrics
from shuffled.server.errors import RESPONSE_STARTED
from shuffled.server.limits import Held, Limiter
from shuffled.server.middleware import Drain
from shuffled.server.streaming.sendfile import Sender
from shuffled.storage import Store


@dataclass(kw_only=True)
class DaemonState:
    settings: Settings
    store: Store
    metrics: Metrics
    uploads: Limiter
    downloads: Limiter
    held_partials: Held  # the partials bulk uploads in flight hold (max_held_partials)
    drain: Drain
    sweeper: Sweeper | None = None  # the expiry sweeper; tests call run_once()
    started: float = field(default_factory=time.time)
    # Work the daemon started for a request and does not wait for (a peer share's warm-up).
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    # This process's identity: a heartbeat answer with another one means a restart.
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)

    async def answer(self, request: web.Request, response: web.StreamResponse) -> Sender:
        """Send ``response``'s head; its body goes out through the returned Sender, each
        wait for the reader bounded by ``send_idle_timeout``. From here on a failure can
        only cut the connection (:func:`.errors.error_middleware`)."""
        await response.prepare(request)
        request[RESPONSE_STARTED] = True
        return Sender(request, response, self.store.run, self.settings.send_idle_timeout,
                      self.metrics.connections_cut.labels(Cut.SEND_TIMEOUT).inc)


STATE = web.AppKey("state", DaemonState)


def state_of(request: web.Request) -> DaemonState:
    return request.app[STATE]
