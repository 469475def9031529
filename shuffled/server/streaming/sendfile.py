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

from shuffled.server.errors import cut

CHUNK = 1 << 20
SMALL = 256 << 10  # pieces up to this size are gathered, not sendfile'd
GATHER = 1 << 20  # bytes gathered per buffer (per concurrent aggregate GET)

T = TypeVar("T")


class Run(Protocol):
    """Runs blocking ``fn(*args)`` off the event loop (the store's I/O threads)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


SENDFILE_STEP = 16 << 20  # bytes per sendfile call: each is one bounded wait for the reader


class Sender:
    """Writes the body of a prepared response. Every wait for the reader is bounded by
    ``idle`` seconds (a write, a drain, a sendfile of at most :data:`SENDFILE_STEP`): a
    reader that takes nothing for that long is cut off, the transport aborted, and
    ConnectionResetError raised, so the request ends and its download slot is freed.
    ``on_cut`` counts it."""

    def __init__(self, request: web.Request, response: web.StreamResponse, run: Run,
                 idle: float, on_cut: Callable[[], None]) -> None:
        self.request = request
        self.response = response
        self.run = run
        self.idle = idle
        self.on_cut = on_cut

    async def _bounded(self, waiting: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.idle):
                return await waiting
        except TimeoutError:
            cut(self.request)
            self.on_cut()
            raise ConnectionResetError(
                f"the reader took nothing for {self.idle:g} s: cut off") from None

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self._bounded(self.response.write(data))

    async def write_eof(self) -> None:
        await self._bounded(self.response.write_eof())

    async def range(self, fobj: IO[bytes], offset: int, count: int) -> None:
        """Write ``count`` bytes of ``fobj`` from ``offset``."""
        if count <= 0:
            return
        transport = self.request.transport
        if transport is None:
            raise ConnectionResetError("client went away")
        loop = asyncio.get_running_loop()
        # sendfile writes to the socket past aiohttp's encoders: only for a plain-TCP
        # response with Content-Length. Without one, aiohttp chunks the body (RFC 9112
        # section 7.1) while ``response.chunked`` stays False (it is set only by
        # enable_chunked_encoding), so the length is what tells: a batched shard read's
        # large run went out raw inside the chunk framing, and the client read garbage.
        if (transport.get_extra_info("sslcontext") is None and not self.response.chunked
                and self.response.content_length is not None):
            try:
                while count > 0:
                    step = min(count, SENDFILE_STEP)
                    await self._bounded(loop.sendfile(transport, fobj, offset, step,
                                                      fallback=False))
                    offset += step
                    count -= step
                return
            except (NotImplementedError, asyncio.exceptions.SendfileNotAvailableError):
                pass
        position, remaining = offset, count
        while remaining > 0:
            chunk = await self.run(_pread, fobj, position, min(CHUNK, remaining))
            if not chunk:
                raise ConnectionResetError(f"file ended {remaining} bytes early")
            await self.write(chunk)
            position += len(chunk)
            remaining -= len(chunk)

    async def ranges(self, ranges: Sequence[Piece]) -> None:
        """Write each ``(file, offset, count)`` (or bytes) in order: runs of small pieces
        gathered into buffers of up to :data:`GATHER` bytes, large ranges with
        :meth:`range`.

        (Reading the next buffer while writing this one was measured slower here: the
        reader thread competes with the event loop for the same cores.)
        """
        batch: list[Piece] = []
        size = 0
        for piece in ranges:
            count = len(piece) if isinstance(piece, bytes) else piece[2]
            large = count > SMALL and not isinstance(piece, bytes)
            if batch and (large or size + count > GATHER):
                await self.write(await self.run(_gather, batch, size))
                batch, size = [], 0
            if large:
                assert not isinstance(piece, bytes)
                await self.range(*piece)
                continue
            batch.append(piece)
            size += count
        if batch:
            await self.write(await self.run(_gather, batch, size))


def _pread(fobj: IO[bytes], offset: int, size: int) -> bytes:
    return os.pread(fobj.fileno(), size, offset)


Piece = tuple[IO[bytes], int, int] | bytes  # a file range, or bytes to send as they are


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
