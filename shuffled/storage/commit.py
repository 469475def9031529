"""Group commit: partials that become durable together share one fdatasync per pack and
one catalog transaction (one WAL fsync).

An upload is acknowledged only once its bytes and its catalog row are on disk. While one
group is being synced, newly finished uploads queue; when it is done they all go as the
next group. So a lone upload pays two fsyncs, and N concurrent or batched ones pay two
between them (the classic database group commit; Celeborn's "commit on mapper end" is the
same idea at a coarser grain).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from shuffled.storage.catalog import Catalog
from shuffled.storage.index import PartialMeta
from shuffled.storage.packs import Pack

_Item = tuple[PartialMeta, Pack, "asyncio.Future[int | None]"]


class GroupCommit:
    """Commits one location's partials in groups, on that location's writer thread."""

    def __init__(self, catalog: Catalog, writer: ThreadPoolExecutor, fsync: bool) -> None:
        self.catalog = catalog
        self.writer = writer
        self.fsync = fsync
        self._queue: list[_Item] = []
        self._draining: asyncio.Task[None] | None = None
        self.groups = 0  # groups committed (for tests and metrics)
        self.partials = 0

    def submit(self, meta: PartialMeta, pack: Pack) -> asyncio.Future[int | None]:
        """Queue ``meta`` (its bytes already in ``pack``); the future gives the size of the
        partial it replaced (None if new) once durable, or the OSError that stopped it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int | None] = loop.create_future()
        self._queue.append((meta, pack, future))
        if self._draining is None:
            self._draining = loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # One loop turn first: partials finishing in the same turn (a batch, concurrent
            # uploads released by the same read) join this group instead of the next.
            await asyncio.sleep(0)
            while self._queue:
                group, self._queue = self._queue, []
                try:
                    olds = await asyncio.shield(
                        loop.run_in_executor(self.writer, self._commit, group))
                except Exception as exc:  # noqa: BLE001 - handed to every waiter
                    for _, pack, future in group:
                        pack.dead = True  # its tail's state is unknown: never append again
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.groups += 1
                self.partials += len(group)
                for (_, pack, future), old in zip(group, olds, strict=True):
                    pack.fresh = False
                    if not future.done():
                        future.set_result(old)
        finally:
            self._draining = None

    def _commit(self, group: Sequence[_Item]) -> list[int | None]:
        """Writer thread: sync each pack once, then one transaction for every row."""
        if self.fsync:
            seen: set[int] = set()
            for _, pack, _ in group:
                if id(pack) not in seen:
                    seen.add(id(pack))
                    pack.sync()
        return self.catalog.commit([meta.row() for meta, _, _ in group])

    async def idle(self) -> None:
        """Wait until nothing is queued or being committed."""
        while self._draining is not None:
            await asyncio.shield(self._draining)
