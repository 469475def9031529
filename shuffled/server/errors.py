"""The one place mapping failures to HTTP responses: JSON ``{"error": ..., "code": ...}``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from shuffled.errors import Overloaded, RangeNotSatisfiable, ShuffleError

log = logging.getLogger("shuffled.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Request keys other middlewares read (metrics: why a request was rejected).
REJECT_REASON = web.RequestKey("reject_reason", str)
# Set once headers went out: an error after that can only drop the connection.
RESPONSE_STARTED = web.RequestKey("response_started", bool)


def error_response(err: ShuffleError) -> web.Response:
    headers = {}
    if isinstance(err, Overloaded):
        # RFC 9110 section 10.2.3: seconds after which the client may retry.
        headers["Retry-After"] = str(err.retry_after)
    elif isinstance(err, RangeNotSatisfiable):
        # RFC 9110 section 15.5.17: a 416 names the current length.
        headers["Content-Range"] = f"bytes */{err.details.get('size', '*')}"
    return web.json_response(err.to_json(), status=err.status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn domain errors and aiohttp's own HTTP errors into JSON error bodies."""
    try:
        return await handler(request)
    except ShuffleError as err:
        request[REJECT_REASON] = err.code
        if request.get(RESPONSE_STARTED):
            raise  # headers already sent: the only honest signal left is a dropped connection
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        request[REJECT_REASON] = exc.reason.lower().replace(" ", "_")
        return web.json_response(
            {"error": exc.text or exc.reason, "code": request[REJECT_REASON]},
            status=exc.status, headers={k: v for k, v in exc.headers.items()
                                        if k.lower() in ("allow", "retry-after")},
        )
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        request[REJECT_REASON] = "internal"
        return web.json_response({"error": "internal server error", "code": "internal"},
                                 status=500)
