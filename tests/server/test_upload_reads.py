"""A large upload is read from the socket in larger pieces than asyncio's 256 KiB, and the
connection reads as before once it has been taken (``streaming.bodies.upload_body``)."""

from __future__ import annotations

import os

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from shuffled.server.streaming import bodies


async def test_a_large_body_is_read_in_larger_pieces_and_the_connection_restored() -> None:
    seen: list[dict[str, object]] = []

    async def take(request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None
        before = transport.max_size  # type: ignore[attr-defined]
        sizes = []
        during = None
        async for chunk in bodies.upload_body(request, idle=30):
            during = transport.max_size  # type: ignore[attr-defined]
            sizes.append(len(chunk))
        seen.append({"before": before, "during": during,
                     "after": transport.max_size,  # type: ignore[attr-defined]
                     "bytes": sum(sizes), "largest": max(sizes, default=0)})
        return web.Response(text="ok")

    app = web.Application(client_max_size=1 << 30)
    app.router.add_put("/up", take)
    large = os.urandom(bodies.LARGE_BODY + 12345)
    async with TestClient(TestServer(app)) as client:
        for body in (large, b"small" * 100, large):
            resp = await client.put("/up", data=body)  # one keep-alive connection
            assert resp.status == 200
    big, small, again = seen
    assert big["during"] == bodies.LARGE_READ > big["before"]
    assert big["after"] == big["before"] and small["during"] == small["before"]
    assert big["bytes"] == again["bytes"] == len(large) and small["bytes"] == 500
    assert again["during"] == bodies.LARGE_READ
