"""Zero-copy sending of file ranges on a prepared response (os.sendfile via the loop).

Falls back to chunked reads in the executor where the transport cannot sendfile (TLS).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import IO

from aiohttp import web

CHUNK = 1 << 20


async def send_range(request: web.Request, response: web.StreamResponse, fobj: IO[bytes],
                     offset: int, count: int,
                     run: Callable[..., Awaitable[bytes]]) -> None:
    """Write ``count`` bytes of ``fobj`` from ``offset`` after ``response`` was prepared."""
    if count <= 0:
        return
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("client went away")
    loop = asyncio.get_running_loop()
    if transport.get_extra_info("sslcontext") is None:
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
