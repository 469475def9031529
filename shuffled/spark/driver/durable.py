"""The driver's view of deep storage: which daemons' shares of the task are in the tier.

Each daemon with deep storage says, in its seal's answer and its task state, its stable
instance in the tier and whether its copy of the seal is complete (docs/deep-storage.md).
A daemon whose copy is complete is *backed*: once it is lost, phase 2 reads its share from
a survivor (``<survivor>/peers/<instance>``) instead of recomputing its subtasks. With
``tuningConfig.shuffleDurability: deep`` the driver waits, after each seal, until every
sealed daemon's copy is complete (the seal counts only then); with ``local`` it takes
what is complete when phase 2 starts, without waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from shuffled.client import ShuffleClient, ShuffleUnavailable
from shuffled.errors import ShuffleError
from shuffled.protocol import PEERS_PATH
from shuffled.spark.driver.context import JobContext
from shuffled.spark.driver.recompute import Recovery

log = logging.getLogger("shuffled.spark")

POLL = 10.0  # seconds one long poll of a daemon's task state may wait
OFFLOAD_WAIT = 3600.0  # most seconds a seal waits for a daemon's copy (durability deep)


class OffloadFailed(ShuffleError):
    """A daemon could not copy the task to deep storage, or has none, with durability
    ``deep``: the ingestion fails (its message says which daemon and why)."""

    code = "ingestion_failed"


def peer_instances(routes: Collection[str]) -> set[str]:
    """The instances named by the peer routes (``<survivor>/peers/<instance>``) among
    ``routes``."""
    return {r.rsplit(PEERS_PATH, 1)[1] for r in routes if PEERS_PATH in r}


@dataclass
class TierShares:
    """Per daemon, its instance in the tier and whether its copy of the seal is complete."""

    instances: dict[str, str] = field(default_factory=dict)
    complete: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)  # their tier copy could not be read

    def note(self, server: str, answer: dict[str, Any] | None) -> str | None:
        """Take a seal answer's or task state's ``deepStorage``; its offload state."""
        deep = (answer or {}).get("deepStorage")
        if not isinstance(deep, dict) or not isinstance(deep.get("instance"), str):
            return None
        self.instances[server] = deep["instance"]
        state = str(deep.get("offload"))
        if state == "complete":
            self.complete.add(server)
        else:
            self.complete.discard(server)
        return state

    def backed(self) -> dict[str, str]:
        """The daemons whose share can be read from the tier: server -> instance."""
        return {s: self.instances[s] for s in sorted(self.complete - self.failed)}

    def routes(self, servers: Sequence[str], lost: Collection[str],
               ) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Per backed daemon, the survivors' routes to its share, the next daemons in the
        job's order first (so the shares of several lost daemons spread)."""
        out = []
        for server, instance in self.backed().items():
            at = servers.index(server) if server in servers else 0
            order = [*servers[at + 1:], *servers[:at]]
            ring = [s for s in order if s != server and s not in lost]
            if ring:
                out.append((server, tuple(f"{s}{PEERS_PATH}{instance}" for s in ring)))
        return tuple(out)

    def give_up(self, routes: Collection[str]) -> list[str]:
        """Phase 2 could not read through ``routes`` (some may be peer routes): the
        daemons whose tier copy is unreadable, from now on recomputed when lost."""
        instances = peer_instances(routes)
        dropped = [s for s, i in self.instances.items() if i in instances and s not in self.failed]
        self.failed.update(dropped)
        return dropped


def seal(ctx: JobContext, committed: dict[str, set[str]], shares: TierShares,
         admin: Callable[[str], ShuffleClient], *, durable: bool) -> list[str]:
    """Seal each daemon with the subtasks that committed there (``committed``); with
    ``durable``, wait until its copy is in the tier (the seal counts only then), else take
    what is complete already. The daemons that did not answer (the caller asks whether
    they are gone)."""
    failed = []
    for server, subs in sorted(committed.items()):
        if server in ctx.lost:
            continue
        try:
            with admin(server) as client:
                shares.note(server, client.seal(ctx.task_id, sorted(subs)))
        except ShuffleUnavailable:
            failed.append(server)
    sealed = [s for s in sorted(committed) if s not in ctx.lost and s not in failed]
    if durable:
        for server in sealed:
            try:
                wait_offloaded([server], ctx.task_id, shares, admin,
                               deadline=time.monotonic() + OFFLOAD_WAIT, say=ctx.say)
            except ShuffleUnavailable:
                failed.append(server)
    elif shares.instances:  # local: what is complete already counts
        for server in sealed:
            try:
                with admin(server) as client:
                    shares.note(server, client.task_state(ctx.task_id))
            except ShuffleUnavailable:
                pass  # asked again at the next seal
    return failed


def warm(ctx: JobContext, shares: TierShares, lost: Collection[str],
         admin: Callable[[str], ShuffleClient]) -> None:
    """Ask the survivor that will serve each of ``lost`` (backed daemons just found gone)
    to start fetching its share now, while phase 2 starts (best effort: a merge task's
    first read fetches what is not there yet)."""
    routes = dict(shares.routes(ctx.servers, ctx.lost))
    for server in lost:
        first = routes.get(server, ())[:1]
        for route in first:
            try:
                with admin(route) as client:
                    client.warm(ctx.task_id)
            except ShuffleError as exc:
                log.info("could not warm %s's share on %s: %s", server, route, exc)


def note_tier_reads(ctx: JobContext, shares: TierShares, recovery: Recovery,
                    routes: Collection[str]) -> None:
    """The merge tasks read through ``routes`` (those of peers among them: the daemons
    whose share came from the tier); those the driver had not found lost itself go in a
    round of their own (found by the merge tasks' reads, during phase 2)."""
    instances = peer_instances(routes)
    recovery.from_tier.update(s for s, i in shares.instances.items() if i in instances)
    read = sorted(s for s in recovery.from_tier if s not in ctx.lost)
    if read:
        ctx.lost.update({s: "declared lost during phase 2" for s in read})
        recovery.lost.update({s: ctx.lost[s] for s in read})
        recovery.round("during phase 2", time.monotonic(), lost=read, readFromTier=read,
                       subtasksRecomputed=0)


def wait_offloaded(servers: Sequence[str], task_id: str, shares: TierShares,
                   client: Callable[[str], ShuffleClient], *, deadline: float,
                   say: Callable[[str], None]) -> None:
    """Until each of ``servers`` says its copy of the seal is complete (long polls of its
    task state). OffloadFailed for a daemon without deep storage or whose copy failed,
    or when ``deadline`` (monotonic) passes; ShuffleUnavailable from a daemon that does
    not answer (the caller asks whether it is gone)."""
    waiting = [s for s in servers if s not in shares.complete]
    if waiting:
        say(f"waiting for {len(waiting)} daemon(s) to copy the task to deep storage "
            "(shuffleDurability deep)")
    started = time.monotonic()
    for server in waiting:
        with client(server) as c:
            known: str | None = None
            while True:
                state = c.task_state(task_id, known=known, max_wait=POLL)
                offload = shares.note(server, state)
                if offload is None:
                    raise OffloadFailed(
                        f"tuningConfig.shuffleDurability is deep but {server} has no deep "
                        "storage: start every daemon with --deep-storage, or use local")
                if offload == "complete":
                    break
                if offload == "failed":
                    why = (state.get("deepStorage") or {}).get("error", "")
                    raise OffloadFailed(f"{server} could not copy {task_id} to deep storage: "
                                        f"{why}", server=server)
                if time.monotonic() > deadline:
                    raise OffloadFailed(f"{server} had not copied {task_id} to deep storage "
                                        f"after {time.monotonic() - started:.0f} s",
                                        server=server)
                known = state.get("tag")
    if waiting:
        log.info("%d daemon(s) copied %s to deep storage in %.1f s", len(waiting), task_id,
                 time.monotonic() - started)
