"""The store's I/O threads, for blocking file work (opening packs, appending, reading).

A location's catalog is written only from its own writer thread, which its
:class:`~shuffled.storage.disk.Disk` owns (:meth:`~shuffled.storage.disk.Disk.on_writer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class IoThreads:
    """``run`` on the shared I/O threads."""

    def __init__(self, io_threads: int = 16) -> None:
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="shuffled-io")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on the I/O threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)
