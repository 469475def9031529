"""One storage location and what it owns, as one object: its directory, lock, health and
counters (:class:`~.location.Location`), its catalog (:class:`~.catalog.Catalog`) and the
one thread that writes that catalog (:meth:`Disk.on_writer`).

The store builds one per configured location and hands the list to the parts that need a
location's catalog or its writer (the committer, removal, the start, slabs, deep storage),
instead of lists kept in step by index."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shuffled.storage.catalog import Catalog
from shuffled.storage.location import Location

T = TypeVar("T")


@dataclass(eq=False)
class Disk:
    location: Location
    catalog: Catalog
    # The catalog's writer: SQLite connections are not shared between threads, and one
    # writer per file is what WAL mode wants, so every catalog write of this location (and
    # its group commit's transactions) runs here, in order.
    writer: ThreadPoolExecutor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.writer = ThreadPoolExecutor(
            1, thread_name_prefix=f"shuffled-commit-{self.location.index}")

    @property
    def index(self) -> int:
        return self.location.index

    @property
    def path(self) -> Path:
        return self.location.path

    async def on_writer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on this location's writer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)

    def shutdown(self) -> None:
        self.writer.shutdown(wait=True)
