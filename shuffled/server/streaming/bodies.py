"""What a client sends, read within bounds: an upload's body, a JSON body, and the
encodings taken.

Each read is bounded in time (``upload_idle_timeout``): a client that stops sending, or
trickles a byte at a time, cannot hold a handler, a slot or a temp file for longer. A body
a client encoded (``Content-Encoding``) is refused for uploads; a corrupt one elsewhere is
the client's 400 (:func:`.errors.error_middleware`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import ClientPayloadError, web

from shuffled.errors import InvalidBody, RequestTimeout, UnsupportedEncoding
from shuffled.server import heap


LARGE_BODY = 8 << 20  # bytes from which an upload is read from the socket in larger pieces
LARGE_READ = 1 << 20  # bytes a socket read may take for such an upload (asyncio's: 256 KiB)


async def upload_body(request: web.Request, idle: float) -> AsyncIterator[bytes]:
    """The upload body as it arrives; a body silent for ``idle`` seconds is abandoned so a
    stalled client cannot hold an upload slot (and its temp file) for ever.

    A large body is read from the socket up to :data:`LARGE_READ` bytes at a time: every
    piece costs a pass through aiohttp's parser and stream and this loop, a quarter of the
    daemon's interpreter time on a 64 MiB slab in asyncio's 256 KiB reads. With 1 MiB reads
    ``bench.slab_profile`` gave 0.43-0.46 user s/GB against 0.55-0.61, for 4-8 MiB more
    heap at the peak; 4 MiB reads doubled the system time (a fresh allocation each).
    (docs/benchmarks.md, "The slab's receive path".)"""
    with _larger_reads(request):
        async for chunk in _chunks(request, idle):
            yield chunk


@contextlib.contextmanager
def _larger_reads(request: web.Request) -> Iterator[None]:
    transport = request.transport
    size = request.content_length
    # asyncio's selector transport reads `max_size` bytes a time; another event loop's
    # transport (uvloop) has no such attribute and is left as it is.
    if (transport is None or size is None or size < LARGE_BODY
            or not isinstance(getattr(transport, "max_size", None), int)):
        yield
        return
    before = transport.max_size  # type: ignore[attr-defined]
    transport.max_size = max(before, LARGE_READ)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        transport.max_size = before  # type: ignore[attr-defined]
        heap.trim()


async def _chunks(request: web.Request, idle: float) -> AsyncIterator[bytes]:
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
