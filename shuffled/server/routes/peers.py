"""A lost peer's share read through this daemon: ``/peers/{instance}`` before a read route.

``POST|GET /peers/{instance}/druid/worker/v1/shuffle/tasks/{sup}/...`` answers the read
routes phase 2 uses (the bulk read, the aggregate GET, a partial, pages) from what the
daemon ``instance`` offloaded to deep storage, as that daemon would have answered them
(:mod:`shuffled.storage.deep.peers`). The driver names the lost daemon's instance (it
learned it from the seal's answer); a client whose base URL ends in the prefix reads the
peer's share with the same calls. Needs the task's read right, like the routes it
prefixes; 404 when the peer's copy is not complete in the tier, or this daemon has no
deep storage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence, Sized
from typing import IO, Any, Protocol

from aiohttp import web

from shuffled.errors import BadTierCopy, CorruptData
from shuffled.protocol import (PEERS_PATH, PartialKey, PartitionKey, TaskDataState,
                               validate_id)
from shuffled.server.errors import Handler
from shuffled.server.state import state_of
from shuffled.storage import PartialMeta

log = logging.getLogger("shuffled.server")

PEER_PREFIX = PEERS_PATH + "{instance}"


class Reads(Protocol):
    """What the read handlers ask of the store (or of a peer's share)."""

    def partition(self, key: PartitionKey, sub_task_ids: Sequence[str] | None = None,
                  ) -> list[PartialMeta]: ...
    def partitions(self, supervisor_task_id: str,
                   wanted: Sequence[tuple[PartitionKey, Sequence[str] | None]],
                   ) -> list[list[PartialMeta]]: ...
    def view(self, key: PartitionKey, sub_task_ids: Sequence[str] | None, token: int,
             ) -> tuple[list[PartialMeta], bool, bool]: ...
    async def localize(self, metas: Sequence[PartialMeta], *,
                       missing: bool = False) -> bool: ...
    async def open_many(self, metas: Sequence[PartialMeta]) -> list[IO[bytes]]: ...
    async def open_partial(self, key: PartialKey) -> tuple[PartialMeta, IO[bytes]]: ...
    def state(self, supervisor_task_id: str) -> TaskDataState: ...


class PeerShare(Reads, Protocol):
    """A lost peer's share (:class:`shuffled.storage.deep.peers.PeerTask`)."""

    @property
    def packs(self) -> Sized: ...
    async def warm(self) -> int: ...


SOURCE = web.RequestKey("reads", PeerShare)


def reads_of(request: web.Request) -> Reads:
    """The reads ``request`` is answered from: a peer's share on a peer route, else the
    store."""
    source = request.get(SOURCE)
    return source if source is not None else state_of(request).store


def peer_route(handler: Handler) -> Handler:
    """``handler`` answering from the share of the peer the path names."""

    async def peer(request: web.Request) -> web.StreamResponse:
        sup = validate_id(request.match_info["sup"], "supervisorTaskId")
        instance = validate_id(request.match_info["instance"], "instance")
        try:
            request[SOURCE] = await state_of(request).store.peer(sup, instance)
            return await handler(request)
        except CorruptData as exc:
            # The peer's copy is unusable (an object missing, or another's bytes): that
            # is the copy's fault, not this daemon's, and the reader needs another source
            # (the driver recomputes the share), as the slab peer route answers.
            raise BadTierCopy(exc.message, **exc.details) from exc

    peer.__name__ = f"peer_{handler.__name__}"
    return peer


async def warm(request: web.Request) -> web.Response:
    """``POST /peers/{instance}/.../tasks/{sup}/warm``: start fetching the peer's whole
    share into this daemon's cache (in the background); 202 with the packs it has."""
    source = request[SOURCE]
    state = state_of(request)
    task = asyncio.get_running_loop().create_task(source.warm())
    state.background.add(task)
    task.add_done_callback(_warmed(state.background))
    return web.json_response({"supervisorTaskId": request.match_info["sup"],
                              "instance": request.match_info["instance"],
                              "packs": len(source.packs)}, status=202)


def _warmed(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("warming a peer's share failed: %s", task.exception())
    return done


def install(app: web.Application, task: str, routes: dict[tuple[str, str], Handler]) -> None:
    """Add ``routes`` ((method, path under ``task``) -> handler) under the peer prefix."""
    for (method, path), handler in routes.items():
        route = f"{PEER_PREFIX}{task}{path}"
        if method == "GET":  # and HEAD, as every GET route
            app.router.add_get(route, peer_route(handler))
        else:
            app.router.add_route(method, route, peer_route(handler))
