"""Where a session's bytes go: a location by round robin and an open pack there.

Owns the placement, the pool of idle packs, pack numbering, and what happens to a pack when
a session is done with it (back to the pool, closed, or removed if nothing of it was ever
committed) or when its location is taken out of service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from shuffled.storage.ondisk import packs
from shuffled.storage.location import Location
from shuffled.storage.placement.roundrobin import RoundRobin
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")
REPROBE_EVERY = 1.0  # seconds between on-demand probes of a full location


def _close_pack(pack: packs.Pack) -> None:
    pack.close()
    pack.remove_if_fresh()


class PackSource:
    """Locations, the idle-pack pool and pack numbers (event loop only)."""

    def __init__(self, locations: Sequence[Location], threads: IoThreads,
                 pack_max_bytes: int) -> None:
        self.locations = list(locations)
        self.threads = threads
        self.max_bytes = pack_max_bytes
        self.placement = RoundRobin(self.locations)
        self.pool = packs.PackPool(pack_max_bytes)
        self.last_number = 0
        self._background: set[asyncio.Future[Any]] = set()

    def new_number(self) -> int:
        self.last_number += 1
        return self.last_number

    def take(self, location: int, sup: str) -> packs.Pack | None:
        """An idle pack of ``sup`` at ``location`` (None: a new one is needed)."""
        return self.pool.take(location, sup)

    async def release(self, pack: packs.Pack) -> None:
        """Give ``pack`` back to the pool, or close it (and remove it if it never held a
        committed partial: a refused upload leaves no file behind)."""
        if pack.fresh or pack.dead:
            pack.dead = True
            await asyncio.shield(self.threads.run(_close_pack, pack))
            return
        extra = self.pool.give(pack)
        if extra is not None:
            self.close_later(extra)

    def take_out(self, loc: Location, reason: str, *, full: bool = False) -> None:
        """An I/O error on ``loc`` (``full``: for want of space): out of service, its idle
        packs closed."""
        if loc.healthy:
            log.error("location %s taken out of service: %s", loc.path, reason)
        loc.mark_unhealthy(reason, full=full)
        for pack in self.pool.drop_location(loc.index):
            self.close_later(pack)

    async def probe(self, locations: Sequence[Location]) -> list[Location]:
        """Probe each of ``locations`` (out of service) on the I/O threads: one that can
        write again and has room is back in service, one that cannot keeps its reason
        ("probe failed: ..."). Returns those back."""
        back = []
        for loc in locations:
            try:
                await self.threads.run(loc.probe)
            except OSError as exc:
                loc.last_error = f"probe failed: {exc.strerror}"
                continue
            loc.mark_healthy()
            back.append(loc)
            log.warning("location %s is back in service", loc.path)
        return back

    async def reprobe_full(self) -> bool:
        """Probe the locations out of service for want of space now, each at most once per
        :data:`REPROBE_EVERY` seconds: space freed since (a DELETE, an expiry) counts for
        the next upload, not only at the sweeper's next probe. True if one came back."""
        now = time.monotonic()
        due = [loc for loc in self.locations
               if not loc.healthy and loc.full and now - loc.probed_at >= REPROBE_EVERY]
        for loc in due:
            loc.probed_at = now
        return bool(await self.probe(due))

    def close_later(self, pack: packs.Pack) -> None:
        self.background(self.threads.run(pack.close))

    def background(self, work: Any) -> None:
        """Run ``work`` (an awaitable) in the background; :meth:`close` waits for it."""
        future = asyncio.ensure_future(work)
        self._background.add(future)
        future.add_done_callback(self._background.discard)

    async def drop_task(self, sup: str) -> None:
        """Close every idle pack of ``sup`` (its task is being deleted)."""
        for pack in self.pool.drop_task(sup):
            await self.threads.run(pack.close)

    async def close(self) -> None:
        for pack in self.pool.all():
            pack.close()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
