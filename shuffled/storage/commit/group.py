"""Group commit: partials that become durable together share one fdatasync per pack, and
nothing else (storage format 5).

An upload is acknowledged only once its bytes and the commit record naming them are on
disk: the record (:mod:`shuffled.storage.ondisk.commits`) is appended to the pack when the
partials are submitted, and the pack's fdatasync makes both durable. The pack is the truth;
the group's catalog transaction that follows does not wait for the WAL's fsync, and a
catalog a power loss left behind is brought up to date from the records at start. While one
group is being synced, newly finished uploads queue; when it is done they all go as the
next group, so N concurrent or batched uploads share the syncs of their packs (the classic
database group commit; Celeborn's "commit on mapper end" is the same idea at a coarser
grain). A submission is a list of partials (a batch's flush), with one future for the lot:
per-partial futures cost more event-loop time than the commit.

With fsync on, the commit is a two-stage pipeline: a group's packs are synced, side by
side (concurrent single PUTs each write their own pack), while the group before it is in
its catalog transaction. A group's rows are committed only after its own packs are synced,
and groups commit in the order they were formed, so the catalog never names a partial its
pack does not hold.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shuffled.storage.catalog import Catalog, Row
from shuffled.storage.ondisk.packs import Pack

#: Threads syncing the packs of one group side by side (besides the writer thread itself).
SYNC_THREADS = 3


@dataclass(slots=True)
class Landed:
    """What committing one partial found: the size of the partial it replaced here, and an
    older copy of the same key in another location (index, row) to forget there."""

    old: int | None
    elsewhere: tuple[int, Row] | None


@dataclass(slots=True)
class _Item:
    rows: list[Row]
    pack: Pack
    look_elsewhere: list[bool]
    future: asyncio.Future[list[Landed]]


class GroupCommit:
    """Commits one location's partials in groups, on that location's writer thread."""

    def __init__(self, index: int, catalog: Catalog, writer: ThreadPoolExecutor, *,
                 fsync: bool, peers: Sequence[tuple[int, Catalog]] = ()) -> None:
        self.index = index
        self.catalog = catalog
        self.writer = writer
        self.fsync = fsync
        self.peers = list(peers)
        self._peer_conns: dict[int, sqlite3.Connection] = {}  # writer thread only
        # Concurrent single PUTs each write their own pack: a group syncs them side by side,
        # so the file system commits its journal once for all of them, not once per pack.
        self._syncers: ThreadPoolExecutor | None = None
        self._arrived: asyncio.Future[None] | None = None  # set by submit() while waiting
        self._queue: list[_Item] = []
        self._draining: asyncio.Task[None] | None = None
        self.groups = 0  # groups committed (metrics)
        self.partials = 0

    def submit(self, rows: list[Row], pack: Pack,
               look_elsewhere: list[bool]) -> asyncio.Future[list[Landed]]:
        """Queue the catalog ``rows`` of partials whose bytes (and commit record) are in
        ``pack``; the future gives one :class:`Landed` per row once durable, or the OSError
        that stopped them."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Landed]] = loop.create_future()
        self._queue.append(_Item(rows, pack, look_elsewhere, future))
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)
        if self._draining is None:
            self._draining = loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        """Commit what is queued, group after group, as a two-stage pipeline: a group's
        packs are synced (stage 1) while the group before it is in its catalog transaction
        (stage 2), so the two syncs of consecutive groups are in flight together and the
        file system can cover both with one journal commit. A group's rows are still
        committed only after its own packs are synced, and groups commit in order."""
        loop = asyncio.get_running_loop()
        landing: asyncio.Future[None] | None = None  # the group in stage 2, if any
        try:
            # One loop turn first: partials finishing in the same turn (a batch, concurrent
            # uploads released by the same read) join this group instead of the next.
            await asyncio.sleep(0)
            while self._queue or landing is not None:
                if not self.fsync or not self._queue:
                    # Nothing to sync first: wait for the transaction in flight (partials
                    # queue meanwhile and go as the next group), or for new partials.
                    landing = await self._wait(landing)
                    if not self._queue:
                        continue
                group, self._queue = self._queue, []
                if self.fsync:
                    error = await self._sync_group(group)
                    if error is not None:
                        self._fail(group, error)
                        continue
                if landing is not None:  # one transaction at a time, in group order
                    await asyncio.shield(landing)
                landing = self._land(loop, group)
        finally:
            self._draining = None
            self._arrived = None

    async def _wait(self, landing: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
        """Until ``landing`` is done, or (with fsync) partials are queued; what is still
        landing then."""
        if landing is None:
            return None
        if not self.fsync:
            await asyncio.shield(landing)
            return None
        self._arrived = asyncio.get_running_loop().create_future()
        await asyncio.wait([landing, self._arrived], return_when=asyncio.FIRST_COMPLETED)
        self._arrived = None
        return None if landing.done() else landing

    async def _sync_group(self, group: Sequence[_Item]) -> BaseException | None:
        """Stage 1: fdatasync each pack of ``group`` once, side by side; the first failure,
        once every sync has ended."""
        loop = asyncio.get_running_loop()
        if self._syncers is None:
            self._syncers = ThreadPoolExecutor(
                SYNC_THREADS, thread_name_prefix=f"shuffled-sync-{self.index}")
        packs = list({id(item.pack): item.pack for item in group}.values())
        if len(packs) == 1:  # the usual case: no gather on the loop
            try:
                await asyncio.shield(loop.run_in_executor(self._syncers, packs[0].sync))
            except Exception as exc:  # noqa: BLE001 - handed to every waiter
                return exc
            return None
        done = await asyncio.shield(asyncio.gather(
            *(loop.run_in_executor(self._syncers, pack.sync) for pack in packs),
            return_exceptions=True))
        return next((r for r in done if isinstance(r, BaseException)), None)

    def _land(self, loop: asyncio.AbstractEventLoop, group: list[_Item]) -> asyncio.Future[None]:
        """Stage 2: the group's catalog transaction on the writer thread; its waiters are
        answered when it is done."""
        landing: asyncio.Future[None] = loop.create_future()
        committing = loop.run_in_executor(self.writer, self._commit, group)

        def landed(f: asyncio.Future[list[list[Landed]]]) -> None:
            if f.cancelled():
                for item in group:
                    item.pack.dead = True
                    item.future.cancel()
            elif (error := f.exception()) is not None:
                self._fail(group, error)
            else:
                self.groups += 1
                for item, result in zip(group, f.result(), strict=True):
                    self.partials += len(item.rows)
                    item.pack.fresh = False
                    if not item.future.done():
                        item.future.set_result(result)
            landing.set_result(None)
        committing.add_done_callback(landed)
        return landing

    @staticmethod
    def _fail(group: Sequence[_Item], exc: BaseException) -> None:
        for item in group:
            item.pack.dead = True  # its tail's state is unknown: never append
            if not item.future.done():
                item.future.set_exception(exc)

    def _commit(self, group: Sequence[_Item]) -> list[list[Landed]]:
        """Writer thread: one transaction for every row of ``group`` (its packs synced)."""
        rows = [row for item in group for row in item.rows]
        # Their packs' commit records were synced in stage 1: the pack is the truth, the
        # catalog need not wait for its own fsync (the second sync of a group, before).
        olds = self.catalog.commit(rows, recorded=True)
        wanted = [row for row, old, look in zip(
            rows, olds, (f for item in group for f in item.look_elsewhere), strict=True)
            if old is None and look]
        found = self._elsewhere(wanted) if wanted else {}
        out, at = [], 0
        for item in group:
            landed = []
            for row in item.rows:
                landed.append(Landed(olds[at], found.get(row.key)))
                at += 1
            out.append(landed)
        return out

    def _elsewhere(self, rows: list[Row]) -> dict[tuple[object, ...], tuple[int, Row]]:
        """Older copies of these keys in the other locations (writer thread; a read-only
        connection per peer, never the peer's own writer)."""
        found: dict[tuple[object, ...], tuple[int, Row]] = {}
        newest = {row.key: row.generation for row in rows}
        for index, peer in self.peers:
            conn = self._peer_conns.get(index)
            if conn is None:
                conn = self._peer_conns[index] = peer.connect_reader()
            for row in peer.find(conn, rows):
                key = row.key
                if row.generation < newest[key] and key not in found:
                    found[key] = (index, row)
        return found

    def close(self) -> None:
        """Writer thread: close the peer connections."""
        for conn in self._peer_conns.values():
            conn.close()
        self._peer_conns.clear()
        if self._syncers is not None:
            self._syncers.shutdown(wait=True)
            self._syncers = None

    async def idle(self) -> None:
        """Wait until nothing is queued or being committed."""
        while self._draining is not None:
            await asyncio.shield(self._draining)

