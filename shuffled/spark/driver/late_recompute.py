"""Recovering from a lost daemon under the late plan (issue 36, docs/slab.md "A lost
daemon"): a subtask is read whole from another copy (``shuffleReplicas`` > 1), or from
the lost daemon's copy in deep storage through a survivor (``<survivor>/peers/<instance>``,
docs/deep-storage.md: a daemon whose offload of its seal completed is *backed*), or its
slabs are made again.

A slab is a flush of one phase-1 attempt, with rows of every chunk and key of it, and a
subtask's flushes are spread over the daemons: a lost daemon costs exactly the subtasks
that stored a slab there and have no live daemon holding all of their slabs, each re-run
on its own input splits on the survivors (new attempts, so new subtask ids). Their earlier slabs on the survivors are superseded: seals only grow
(docs/paged-reads.md), so they stay sealed, and every read names them in ``without``
(``POST .../shards``), which leaves them out; the re-run's slabs are sealed beside them.
The plan itself stands: the re-run reads the same rows, and the shards are key ranges, so
only which daemons hold each chunk changes. A backed daemon's slabs are read through its
peer route as from the daemon itself (the same slabs, the same ``without``, the same slab
count), so nothing is re-run; when that copy cannot be read after all (a merge task
reports the route lost), its backing is given up and its subtasks are re-run. Rows read are then checked in total against
the slabs kept (a re-run flushes where its own memory says, so per chunk they may differ
from phase 1's statistics, never in total).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from shuffled.spark import records
from shuffled.spark.driver import durable, recompute
from shuffled.spark.driver.failed import IngestionFailed
from shuffled.spark.driver.report import counted
from shuffled.protocol import PEERS_PATH
from shuffled.spark.phase1.config import Keying
from shuffled.spark.phase2.shardplan import ChunkPlan
from shuffled.spark.records import SlabSent

#: The driver's :class:`shuffled.spark.driver.job.Job` (typed loosely: it imports this).
Job = Any


@dataclass
class CommittedSlabs:
    """The late plan's committed slabs, after any recompute, and which daemon each
    subtask's slabs are read from.

    Reads are per (daemon, subtask): a daemon is asked for all of a subtask's slabs it
    holds, or told to leave the subtask out (``without``). With ``shuffleReplicas`` > 1 a
    slab is on several daemons and must be read from one: a subtask is read whole from
    one daemon holding every slab of it (its flushes go to the first daemons of its ring
    that take them, so one that never failed it holds all). A subtask that cannot be read
    so (every copy of a slab lost) is re-run (:func:`recover`)."""

    kept: list[SlabSent]  # read by phase 2
    superseded: list[SlabSent] = field(default_factory=list)  # sealed, never read again
    # subtask -> the daemons it is read from (each of its slabs from exactly one)
    reader: dict[str, frozenset[str]] = field(default_factory=dict)
    # a lost daemon whose slabs are in deep storage -> the survivor's route to them
    via: dict[str, str] = field(default_factory=dict)

    def _holders(self, sl: SlabSent) -> set[str]:
        """Where ``sl`` is read from: its daemons, a lost one's route in its place."""
        return {self.via.get(h, h) for h in sl.holders}

    def sealed_on(self) -> dict[str, set[str]]:
        """Per daemon, the subtasks its seal names: every one with a slab there, kept or
        superseded (a seal only grows)."""
        on: dict[str, set[str]] = {}
        for sl in (*self.kept, *self.superseded):
            for server in sl.holders:
                on.setdefault(server, set()).add(sl.sub)
        return on

    def choose(self, gone: Collection[str]) -> list[int]:
        """Pick the daemons each kept subtask is read from: every slab of it from exactly
        one of them, none ``gone`` (but those read through a route, :attr:`via`); earlier picks are kept while they still do, new ones
        are one daemon holding the whole subtask (the least loaded), else, for slabs of
        one copy each, every daemon holding one. Returns the phase-1 subtasks (Spark
        partitions) with a subtask that cannot be read so."""
        copies: dict[str, list[set[str]]] = {}
        for sl in self.kept:
            copies.setdefault(sl.sub, []).append(self._holders(sl) - set(gone))
        load: dict[str, int] = {}
        reader: dict[str, frozenset[str]] = {}

        def take(sub: str, servers: frozenset[str]) -> None:
            reader[sub] = servers
            for live in copies[sub]:
                for server in live & servers:
                    load[server] = load.get(server, 0) + 1

        for sub, before in self.reader.items():
            if sub in copies and all(len(live & before) == 1 for live in copies[sub]):
                take(sub, before - set(gone))
        for sub in sorted(copies, key=lambda x: -len(copies[x])):
            if sub in reader:
                continue
            live = copies[sub]
            whole = set.intersection(*live)
            if whole:
                take(sub, frozenset([min(whole, key=lambda x: (load.get(x, 0), x))]))
            elif all(len(c) == 1 for c in live):  # one copy each, on several daemons
                take(sub, frozenset().union(*live))
        self.reader = reader
        return sorted({sl.task for sl in self.kept if sl.sub not in reader})

    def counts(self) -> dict[str, int]:
        """The slabs each daemon is read for (what each read must find there)."""
        out: dict[str, int] = {}
        for sl in self.kept:
            for server in self._holders(sl) & self.reader[sl.sub]:
                out[server] = out.get(server, 0) + 1
        return out

    def without(self) -> dict[str, frozenset[str]]:
        """Per daemon (or route to a lost one's copy: the same seal), the sealed subtasks
        it is not read for (superseded, or read from another copy)."""
        out = {}
        for server, subs in self.sealed_on().items():
            read = self.via.get(server, server)
            out[read] = frozenset(sub for sub in subs
                                  if read not in self.reader.get(sub, frozenset()))
        return out

    @property
    def readers(self) -> tuple[str, ...]:
        return tuple(sorted(frozenset().union(*self.reader.values())))

    @property
    def rows(self) -> int:
        return sum(sl.rows for sl in self.kept)

    def replace(self, tasks: Collection[int], rerun: list[SlabSent]) -> None:
        """``tasks``' slabs superseded by ``rerun``'s."""
        again = set(tasks)
        self.superseded += [sl for sl in self.kept if sl.task in again]
        self.kept = [sl for sl in self.kept if sl.task not in again] + rerun


def seal(job: Job, slabs: CommittedSlabs) -> list[str]:
    """Seal each daemon with its subtasks (with ``shuffleDurability`` deep, the seal
    counts once its copy is in deep storage); the daemons that could not be sealed."""
    return durable.seal(job.ctx, slabs.sealed_on(), job.shares, job._admin,
                        durable=job.spec.shuffle_durability == "deep")


def sealed(job: Job, keyed: Keying, slabs: CommittedSlabs, plans: list[ChunkPlan],
           when: str) -> list[ChunkPlan]:
    """:func:`recover`, then :func:`seal`, again while a daemon fails its seal; the plans
    with the daemons now holding each chunk."""
    for _ in range(len(job.ctx.servers) + 1):
        plans = recover(job, keyed, slabs, plans, when)
        if not seal(job, slabs):
            return plans
    raise IngestionFailed("the shuffle daemons could not be sealed")


def recover(job: Job, keyed: Keying, slabs: CommittedSlabs, plans: list[ChunkPlan],
            when: str) -> list[ChunkPlan]:
    """Ask which daemons are gone (waiting out a restart); if any held kept slabs, re-run
    the subtasks that stored them on the survivors."""
    ctx = job.ctx
    gone = (ctx.monitor.verdict(ctx.survivors, backed=job.shares.backed())
            if ctx.monitor is not None else {})
    ctx.lost.update(gone)
    job.recovery.lost.update(gone)
    tier = route(job, slabs)
    if tier:  # their slabs are read from deep storage: nothing of theirs is re-run
        job.say(f"recovering: {', '.join(tier)} lost; reading its slabs from deep storage "
                "through the survivors")
        job.recovery.from_tier.update(tier)
        job.recovery.round(when, time.monotonic(), lost=tier, readFromTier=tier,
                           subtasksRecomputed=0)
        durable.warm(ctx, job.shares, tier, job._admin)
    tasks = slabs.choose(ctx.lost)
    if not tasks:  # every subtask is read whole from a live daemon
        return plans
    if not ctx.survivors:
        raise RuntimeError("every shuffle daemon is gone")  # explained by _explain_loss
    started = time.monotonic()
    ctx.enter("recompute (lost daemon)")
    job.say(f"recovering: {', '.join(ctx.lost)} lost; running "
            f"{counted(len(tasks), 'phase-1 subtask')} again on "
            f"{counted(len(ctx.survivors), 'daemon')} (their slabs there were the only copy)")
    rerun = _rerun(job, keyed, tasks)
    dropped = sum(1 for sl in slabs.kept if sl.task in set(tasks))
    slabs.replace(tasks, rerun)
    if slabs.choose(ctx.lost):  # the re-run's slabs are on live daemons, whole
        raise IngestionFailed("a phase-1 subtask run again to recover a lost daemon "
                              "stored its slabs on no daemon whole")
    holding = {server for sl in rerun for server in sl.holders}
    lost = set(ctx.lost) - set(slabs.via)  # those read from the tier still hold theirs
    plans = [replace(p, servers=tuple(sorted((set(p.servers) - lost) | holding)))
             for p in plans]
    job.recovery.round(when, started, lost=sorted(gone) or sorted(lost),
                       subtasksRecomputed=len(tasks), slabsDropped=dropped,
                       slabsRecomputed=len(rerun), bytesRecomputed=sum(s.bytes for s in rerun))
    return plans


def route(job: Job, slabs: CommittedSlabs) -> list[str]:
    """Read each lost daemon whose copy in deep storage is complete (and was not given
    up) through the first survivor's peer route (:attr:`CommittedSlabs.via`, chosen
    again each time: a survivor may be lost too); the daemons newly read so."""
    ctx = job.ctx
    routes = dict(job.shares.routes(ctx.servers, ctx.lost))
    via = {server: routes[server][0] for server in ctx.lost if routes.get(server)}
    new = sorted(s for s in via if s not in slabs.via)
    slabs.via = via
    return new


def lost_routes(job: Job, lost: Collection[str]) -> list[str]:
    """Phase 2 could not read ``lost`` (daemons, or routes to lost daemons' copies): the
    backed daemons whose copy could not be read are given up (their subtasks are re-run
    by the next :func:`recover`); the daemons among ``lost``."""
    dropped = job.shares.give_up(lost)
    job.recovery.from_tier.difference_update(dropped)  # not read from the tier after all
    if dropped:
        job.say(f"phase 2: the deep-storage copies of {', '.join(dropped)} could not be "
                "read; running what they held again")
    return [s for s in lost if PEERS_PATH not in s]


def _rerun(job: Job, keyed: Keying, tasks: list[int]) -> list[SlabSent]:
    """The subtasks ``tasks`` on their own splits, cut so that every core takes part."""
    assert job._native_input is not None  # the late plan reads natively
    ninput, splits = job._native_input
    ids, work = recompute.spread(splits, tasks, job.spark.sparkContext.defaultParallelism)
    cfg = replace(job.ctx.phase1_config(job.may_be_multi, partition_ids=tuple(ids)),
                  slabs=keyed)
    got = list(map(records.load, job._native(cfg, ninput, work)))
    declined = [r.reason for r in got if isinstance(r, records.Declined)]
    if declined:  # it read the same input before: only a changed input gets here
        raise IngestionFailed("a phase-1 subtask run again to recover a lost daemon could "
                              f"not read its input any more: {declined[0]}")
    return [r for r in got if isinstance(r, SlabSent)]
