"""What a client sends, read within bounds: an upload's body, a JSON body, and the
encodings taken.

Each read is bounded in time (``upload_idle_timeout``): a client that stops sending, or
trickles a byte at a time, cannot hold a handler, a slot or a temp file for longer. A body
a client encoded (``Content-Encoding``) is refused for uploads; a corrupt one elsewhere is
the client's 400 (:func:`.errors.error_middleware`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import ClientPayloadError, web

from shuffled.errors import InvalidBody, RequestTimeout, UnsupportedEncoding


async def upload_body(request: web.Request, idle: float) -> AsyncIterator[bytes]:
    """The upload body as it arrives; a body silent for ``idle`` seconds is abandoned so a
    stalled client cannot hold an upload slot (and its temp file) for ever."""
    content = request.content
    try:
        while True:
            try:
                async with asyncio.timeout(idle):
                    chunk = await content.readany()
            except TimeoutError:
                raise RequestTimeout(f"upload body stalled: nothing received for {idle:g} s; "
                                     f"the upload was abandoned, send it again") from None
            if not chunk:
                return
            yield chunk
    except (ClientPayloadError, asyncio.IncompleteReadError, ConnectionError) as exc:
        raise InvalidBody(f"upload body ended early: {exc}") from exc


async def read_json(request: web.Request, idle: float) -> Any:
    """The request's JSON body (at most ``client_max_size``), read within ``idle`` seconds
    in all; RequestTimeout past it. Raises ValueError (or UnicodeDecodeError) for a body
    that is not JSON: the caller says what it wanted."""
    try:
        async with asyncio.timeout(idle):
            return await request.json()
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {idle:g} s "
                             "(upload_idle_timeout); send it again") from None


def refuse_encoded(request: web.Request) -> None:
    """Uploads are taken as sent: a Content-Encoding (which aiohttp would decode) leaves
    the Content-Length and Content-Digest describing other bytes than those stored."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding[:32]!r} is not taken for uploads: send the Arrow "
            "stream as it is (compress its buffers with Arrow's own LZ4 or ZSTD instead)",
            field="Content-Encoding")
