"""A ShuffleClient on a thread against a test server on this event loop, and a retry policy
that does not wait."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from aiohttp.test_utils import TestClient

from shuffled.client import RetryPolicy, ShuffleClient

FAST = RetryPolicy(attempts=3, backoff=0.0, max_backoff=0.0, deadline=30.0)


async def in_thread(server: TestClient, run: Callable[[ShuffleClient], Any]) -> Any:
    """``run(client)`` on a thread while this loop serves ``server``; its result or error."""
    url = str(server.make_url("")).rstrip("/")
    out: list[Any] = []

    def main() -> None:
        try:
            with ShuffleClient(url, retry=FAST) as client:
                out.append(run(client))
        except Exception as exc:  # handed back to the test
            out.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    async with asyncio.timeout(60):
        while thread.is_alive():
            await asyncio.sleep(0.01)  # let the server on this loop answer the thread
    thread.join()
    if isinstance(out[0], Exception):
        raise out[0]
    return out[0]
