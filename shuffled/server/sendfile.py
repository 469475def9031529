"""Sending file ranges on a prepared response.

A large range goes zero-copy (os.sendfile via the loop), falling back to chunked reads in the
executor where the transport cannot sendfile (TLS). Many small ranges (an aggregate GET of
small partial segments) are read together into one buffer per executor call instead: each
``loop.sendfile`` costs a pause/drain/resume of the connection, about two event-loop turns,
which for 64 KiB pieces is more than the copy it saves.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import IO, Any, Protocol, TypeVar

from aiohttp import web

CHUNK = 1 << 20
SMALL = 256 << 10  # pieces up to this size are gathered, not sendfile'd
GATHER = 1 << 20  # bytes gathered per buffer (per concurrent aggregate GET)

T = TypeVar("T")


class Run(Protocol):
    """Runs blocking ``fn(*args)`` off the event loop (the store's I/O threads)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


async def send_range(request: web.Request, response: web.StreamResponse, fobj: IO[bytes],
                     offset: int, count: int,
                     run: Run) -> None:
    """Write ``count`` bytes of ``fobj`` from ``offset`` after ``response`` was prepared."""
    if count <= 0:
        return
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("client went away")
    loop = asyncio.get_running_loop()
    # sendfile writes to the socket past aiohttp's encoders: only for a plain-TCP response
    # with Content-Length (chunked coding, RFC 9112 section 7.1, would be left out).
    if transport.get_extra_info("sslcontext") is None and not response.chunked:
        try:
            await loop.sendfile(transport, fobj, offset, count, fallback=False)
            return
        except (NotImplementedError, asyncio.exceptions.SendfileNotAvailableError):
            pass
    position, remaining = offset, count
    while remaining > 0:
        chunk = await run(_pread, fobj, position, min(CHUNK, remaining))
        if not chunk:
            raise ConnectionResetError(f"file ended {remaining} bytes early")
        await response.write(chunk)
        position += len(chunk)
        remaining -= len(chunk)


def _pread(fobj: IO[bytes], offset: int, size: int) -> bytes:
    return os.pread(fobj.fileno(), size, offset)


Piece = tuple[IO[bytes], int, int] | bytes  # a file range, or bytes to send as they are


async def send_ranges(request: web.Request, response: web.StreamResponse,
                      ranges: Sequence[Piece],
                      run: Run) -> None:
    """Write each ``(file, offset, count)`` (or bytes) in order: runs of small pieces
    gathered into buffers of up to :data:`GATHER` bytes, large ranges with
    :func:`send_range`.

    (Reading the next buffer while writing this one was measured slower here: the reader
    thread competes with the event loop for the same cores.)
    """
    batch: list[Piece] = []
    size = 0
    for piece in ranges:
        count = len(piece) if isinstance(piece, bytes) else piece[2]
        large = count > SMALL and not isinstance(piece, bytes)
        if batch and (large or size + count > GATHER):
            await response.write(await run(_gather, batch, size))
            batch, size = [], 0
        if large:
            assert not isinstance(piece, bytes)
            await send_range(request, response, *piece, run)
            continue
        batch.append(piece)
        size += count
    if batch:
        await response.write(await run(_gather, batch, size))


def _gather(ranges: Sequence[Piece], size: int) -> bytearray:
    """Read every range into one buffer (one executor call for the lot)."""
    buf = bytearray(size)
    view = memoryview(buf)
    at = 0
    for piece in ranges:
        if isinstance(piece, bytes):
            view[at: at + len(piece)] = piece
            at += len(piece)
            continue
        fobj, offset, count = piece
        got = os.preadv(fobj.fileno(), [view[at: at + count]], offset)
        if got != count:
            raise ConnectionResetError(f"file ended {count - got} bytes early")
        at += count
    return buf
