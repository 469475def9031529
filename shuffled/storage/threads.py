"""The store's threads: I/O threads for blocking file work, one writer thread per location.

A location's catalog is written only from its writer thread (SQLite connections are not
shared between threads, and one writer per file is what WAL mode wants); everything else
that blocks (opening packs, appending, reading) runs on the shared I/O threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class IoThreads:
    """``run`` on the I/O threads, ``on_writer`` on a location's writer thread."""

    def __init__(self, locations: int, io_threads: int = 16) -> None:
        self.writers = [ThreadPoolExecutor(1, thread_name_prefix=f"shuffled-commit-{i}")
                        for i in range(locations)]
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="shuffled-io")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on the I/O threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def on_writer(self, index: int, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on location ``index``'s writer thread (catalog writes)."""
        return await asyncio.get_running_loop().run_in_executor(self.writers[index], fn, *args)

    def shutdown(self) -> None:
        for writer in self.writers:
            writer.shutdown(wait=True)
        self._executor.shutdown(wait=True, cancel_futures=False)
