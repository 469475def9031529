"""After a large upload the daemon gives its free heap back (``server.heap.trim``): what a
body of 1 MiB socket reads left free does not stay in the resident set for the requests
that follow."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from shuffled.server import heap
from shuffled.server.streaming import bodies


_CHECK = """
import ctypes, os
from shuffled.server import heap

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

libc = ctypes.CDLL(None)
libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD: freed memory kept, as the daemon keeps 16 MiB
libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: 1 MiB blocks from the heap, as the daemon's
held = [bytearray(os.urandom(256)) * 4096 for _ in range(32)]  # 32 MiB, touched
del held
before = anon()
heap.trim()
print(before - anon())
"""


def test_trim_returns_freed_heap_pages() -> None:
    """In a process of its own (the settings are the process's): 32 MiB freed and kept by
    glibc's thresholds, then given back by the trim."""
    out = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True,
                         timeout=60, check=True)
    assert int(out.stdout) > 16 << 10, out.stdout  # KiB given back: over 16 MiB of the 32


async def test_a_large_upload_trims_the_heap_once_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(1))

    async def take(request: web.Request) -> web.Response:
        async for _ in bodies.upload_body(request, idle=30):
            assert not calls  # not while the body arrives
        return web.Response(text="ok")

    app = web.Application(client_max_size=1 << 30)
    app.router.add_put("/up", take)
    async with TestClient(TestServer(app)) as client:
        for body in (b"small" * 100, os.urandom(bodies.LARGE_BODY)):
            assert (await client.put("/up", data=body)).status == 200
    assert calls == [1]  # the large body only
