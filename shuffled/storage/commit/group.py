"""Group commit: partials that become durable together share one fdatasync per pack and
one catalog transaction (one WAL fsync).

An upload is acknowledged only once its bytes and its catalog row are on disk. While one
group is being synced, newly finished uploads queue; when it is done they all go as the
next group. So a lone upload pays two fsyncs, and N concurrent or batched ones pay two
between them (the classic database group commit; Celeborn's "commit on mapper end" is the
same idea at a coarser grain). A submission is a list of partials (a batch's flush), with
one future for the lot: per-partial futures cost more event-loop time than the commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shuffled.storage.catalog import Catalog, Row
from shuffled.storage.ondisk.packs import Pack
from shuffled.storage.ondisk.records import PartialMeta


@dataclass(slots=True)
class Landed:
    """What committing one partial found: the size of the partial it replaced here, and an
    older copy of the same key in another location (index, row) to forget there."""

    old: int | None
    elsewhere: tuple[int, Row] | None


@dataclass(slots=True)
class _Item:
    metas: list[PartialMeta]
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
        self._queue: list[_Item] = []
        self._draining: asyncio.Task[None] | None = None
        self.groups = 0  # groups committed (metrics)
        self.partials = 0

    def submit(self, metas: list[PartialMeta], pack: Pack,
               look_elsewhere: list[bool]) -> asyncio.Future[list[Landed]]:
        """Queue ``metas`` (their bytes already in ``pack``); the future gives one
        :class:`Landed` per meta once durable, or the OSError that stopped them."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Landed]] = loop.create_future()
        self._queue.append(_Item(metas, pack, look_elsewhere, future))
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
                    landed = await asyncio.shield(
                        loop.run_in_executor(self.writer, self._commit, group))
                except Exception as exc:  # noqa: BLE001 - handed to every waiter
                    for item in group:
                        item.pack.dead = True  # its tail's state is unknown: never append
                        if not item.future.done():
                            item.future.set_exception(exc)
                    continue
                self.groups += 1
                for item, result in zip(group, landed, strict=True):
                    self.partials += len(item.metas)
                    item.pack.fresh = False
                    if not item.future.done():
                        item.future.set_result(result)
        finally:
            self._draining = None

    def _commit(self, group: Sequence[_Item]) -> list[list[Landed]]:
        """Writer thread: sync each pack once, then one transaction for every row."""
        if self.fsync:
            seen: set[int] = set()
            for item in group:
                if id(item.pack) not in seen:
                    seen.add(id(item.pack))
                    item.pack.sync()
        rows = [meta.row() for item in group for meta in item.metas]
        olds = self.catalog.commit(rows)
        wanted = [row for row, old, look in zip(
            rows, olds, (f for item in group for f in item.look_elsewhere), strict=True)
            if old is None and look]
        found = self._elsewhere(wanted) if wanted else {}
        out, at = [], 0
        for item in group:
            landed = []
            for meta in item.metas:
                row = rows[at]
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

    async def idle(self) -> None:
        """Wait until nothing is queued or being committed."""
        while self._draining is not None:
            await asyncio.shield(self._draining)

