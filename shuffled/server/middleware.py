"""Cross-cutting request handling: draining on shutdown, metrics timing, request ids and
the access log (who may do what: :mod:`.access`)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Middleware
from aiohttp.web_request import BaseRequest

from shuffled.errors import BadRequest, Overloaded, ShuffleError
from shuffled.metrics import Metrics
from shuffled.protocol import Interval
from shuffled.server.errors import REJECT_REASON, Handler, error_response

HEALTH_PATH = "/status/health"
HEARTBEAT_SUFFIX = "/heartbeat"
METRICS_PATH = "/metrics"
REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID = web.RequestKey("request_id", str)
# Body bytes a handler sent itself (sendfile bypasses aiohttp's byte count).
SENT_BYTES = web.RequestKey("sent_bytes", int)
# A caller's own id (a Spark task attempt, a trace id) is kept if it is short and plain.
_GIVEN_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
_PLAIN = re.compile(r"[A-Za-z0-9._:@/+=,-]{1,300}")


def request_id(request: BaseRequest) -> str:
    """The request's id: the caller's ``X-Request-Id`` if usable, else a new random one."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        given = request.headers.get(REQUEST_ID_HEADER, "")
        # Not a uuid4: its os.urandom is a system call per request (2% of the event
        # loop's time in single PUTs), and an id to grep logs by needs no secrecy.
        rid = given if _GIVEN_ID.fullmatch(given) else f"{random.getrandbits(64):016x}"
        request[REQUEST_ID] = rid
    return rid


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer, streamed ones too, names its request id."""
    response.headers[REQUEST_ID_HEADER] = request_id(request)


def _field(value: str) -> str:
    # Ids and query values come from the client: quote anything that could forge a field
    # or a line (%0A decodes to a newline in a path segment).
    return value if _PLAIN.fullmatch(value) else json.dumps(value)


class AccessLog(AbstractAccessLogger):
    """One line per request, greppable by partial segment.

    ``"PUT /druid/worker/v1/shuffle/tasks/S/s1/partition?... HTTP/1.1" 201 in=1234 out=310
    time=0.004 rid=3f2a... remote=10.0.0.7 sup=S sub=s1
    interval=2018-01-01T00:00:00.000Z/2018-01-02T00:00:00.000Z partitionId=0``

    The interval is canonical (UTC milliseconds) whatever form the client sent, so one
    ``grep 'sup=S .*interval=I partitionId=P'`` finds a partial's upload, its fetches (per
    partial and whole partition) and its deletion. ``in``/``out`` are body bytes received
    and sent, ``time`` seconds from headers in to last byte out, ``err`` the error code of
    a rejected request (the ``reason`` of shuffled_rejected_requests_total).
    """

    def log(self, request: BaseRequest, response: web.StreamResponse, time: float) -> None:
        version = request.version
        received = getattr(request.content, "total_bytes", 0)
        sent = request.get(SENT_BYTES, response.body_length)
        parts = [
            f'"{request.method} {request.raw_path} HTTP/{version.major}.{version.minor}"',
            str(response.status), f"in={received}", f"out={sent}", f"time={time:.6f}",
            f"rid={_field(request_id(request))}", f"remote={_field(request.remote or '-')}",
        ]
        match = getattr(request, "match_info", None) or {}
        for key, name in (("sup", "sup"), ("sub", "sub")):
            if key in match:
                parts.append(f"{name}={_field(match[key])}")
        query = request.query
        if "start" in query or "end" in query:
            start, end = query.get("start", ""), query.get("end", "")
            try:
                interval = str(Interval.parse(start, end))
            except ShuffleError:
                interval = f"{start}/{end}"  # as sent: the request was refused anyway
            parts.append(f"interval={_field(interval)}")
        if "partitionId" in query:
            parts.append(f"partitionId={_field(query['partitionId'])}")
        if "token" in query:  # paged reads: a reader's progress, token by token
            parts.append(f"token={_field(query['token'])}")
        reason = request.get(REJECT_REASON)
        if reason is not None:
            parts.append(f"err={_field(reason)}")
        self.logger.info(" ".join(parts))

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(20)  # logging.INFO


class Drain:
    """Tracks requests in flight; once draining, new requests get 503 + Retry-After."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle: asyncio.Event | None = None
        # Called once draining starts (long polls answer at once instead of holding on).
        self.on_drain: list[Callable[[], None]] = []

    def start(self) -> None:
        """Stop taking requests: from now on they get 503 + Retry-After."""
        self.draining = True
        for callback in self.on_drain:
            callback()

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
        # Health and heartbeats are answered while draining: a heartbeat's answer is how a
        # supervisor learns this daemon is restarting, not gone (docs/failover.md).
        if self.draining and request.path != HEALTH_PATH and not request.path.endswith(
                HEARTBEAT_SUFFIX):
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


def metrics_middleware(metrics: Metrics) -> Middleware:
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


#: The query parameters a request may repeat (a read of several named subtasks); every
#: other one is single-valued, and a repetition is refused rather than "first one wins".
MULTI_VALUED = frozenset({"subTaskId"})


@web.middleware
async def single_valued_query(request: web.Request, handler: Handler) -> web.StreamResponse:
    query = request.query
    if len(query) != len(set(query)):
        for name in dict.fromkeys(query):
            count = len(query.getall(name))
            if count > 1 and name not in MULTI_VALUED:
                raise BadRequest(f"query parameter {name!r} is given {count} times: give it "
                                 "once", field=name)
    return await handler(request)
