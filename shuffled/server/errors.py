"""The one place mapping failures to HTTP responses: JSON ``{"error": ..., "code": ...}``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from shuffled.errors import (
    InvalidBody, Overloaded, RangeNotSatisfiable, ShuffleError,
)

log = logging.getLogger("shuffled.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Request keys other middlewares read (metrics: why a request was rejected).
REJECT_REASON = web.RequestKey("reject_reason", str)
# Set once headers went out: an error after that can only drop the connection.
RESPONSE_STARTED = web.RequestKey("response_started", bool)


def error_headers(err: ShuffleError) -> dict[str, str]:
    """The headers an error's answer carries, whoever makes its body."""
    if isinstance(err, Overloaded):
        # RFC 9110 section 10.2.3: seconds after which the client may retry.
        return {"Retry-After": str(err.retry_after)}
    if isinstance(err, RangeNotSatisfiable):
        # RFC 9110 section 15.5.17: a 416 names the current length.
        return {"Content-Range": f"bytes */{err.details.get('size', '*')}"}
    return {}


def error_response(err: ShuffleError) -> web.Response:
    return web.json_response(err.to_json(), status=err.status, headers=error_headers(err))


def cut(request: web.Request) -> None:
    """Drop the request's connection at once: an answer that cannot be finished must reach
    its reader as a cut stream, never as a whole response (aiohttp would otherwise write a
    500 response into a body whose headers it still buffered)."""
    transport = request.transport
    if transport is not None:
        transport.abort()


def error_middleware(on_cut: Callable[[], None]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Turn domain errors and aiohttp's own HTTP errors into JSON error bodies; once an
    answer's headers went out (RESPONSE_STARTED), cut the connection instead (``on_cut``
    counts it)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except (ConnectionResetError, ConnectionError):
            raise
        except Exception as exc:
            if not request.get(RESPONSE_STARTED):
                return _error_answer(request, exc)
            request[REJECT_REASON] = getattr(exc, "code", "internal")
            log.error("%s %s failed after its answer began (%s): connection cut",
                      request.method, request.path, exc,
                      exc_info=not isinstance(exc, ShuffleError))
            cut(request)
            on_cut()
            raise ConnectionResetError("answer cut: " + str(exc)) from exc

    return middleware


def _body_fault(exc: Exception) -> InvalidBody | None:
    """The client's fault in a body aiohttp could not decode (a corrupt gzip or deflate
    stream, bad chunked coding), as a 400; None for anything else."""
    if not isinstance(exc, (RequestPayloadError, HttpProcessingError)):
        return None
    chain: BaseException | None = exc
    while chain is not None and not isinstance(chain, ContentEncodingError):
        chain = chain.__cause__ or chain.__context__
    if chain is not None:
        return InvalidBody("the body's Content-Encoding could not be decoded: the "
                           "compressed stream is corrupt", field="Content-Encoding")
    return InvalidBody(f"the request body is malformed: {exc}", field="body")


def _error_answer(request: web.Request, exc: Exception) -> web.StreamResponse:
    fault = _body_fault(exc)
    if fault is not None:
        exc = fault
    if isinstance(exc, ShuffleError):
        request[REJECT_REASON] = exc.code
        return error_response(exc)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        request[REJECT_REASON] = exc.reason.lower().replace(" ", "_")
        return web.json_response(
            {"error": exc.text or exc.reason, "code": request[REJECT_REASON]},
            status=exc.status, headers={k: v for k, v in exc.headers.items()
                                        if k.lower() in ("allow", "retry-after")},
        )
    log.error("unexpected error serving %s %s", request.method, request.path, exc_info=exc)
    request[REJECT_REASON] = "internal"
    return web.json_response({"error": "internal server error", "code": "internal"},
                             status=500)
