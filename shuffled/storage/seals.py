"""Seals: which subtasks of a supervisor task are committed, as its supervisor declared.

A seal is written once phase 1 has committed (``PUT /tasks/{sup}/seal``); from then on a
partition of the task reads as complete once a reader has passed every partial of those
subtasks, and partials of other (failed or duplicate) attempts are not served by paged
reads. It must survive a restart, or a restarted daemon would answer "not complete" for
ever. Stored as one small JSON file per task in every location's metadata directory
(``<location>/.shuffled/seals/<supervisorTaskId>.json``), written atomically; any copy
serves at start (copies agree: a second seal may only add subtasks, and the newest
replaces every copy). Versioned: a file of
another version is refused at start with a message, never silently read.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from shuffled.errors import Conflict
from shuffled.storage.book import TaskBook
from shuffled.storage.inflight import Uploads
from shuffled.storage.layout import meta_dir, write_json_atomic
from shuffled.storage.location import Location
from shuffled.storage.oserrors import translate
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")

SEAL_VERSION = 1
SEALS_DIR = "seals"


def seals_dir(root: Path) -> Path:
    return meta_dir(root) / SEALS_DIR


def write_seal(root: Path, sup: str, subs: frozenset[str], fsync: bool) -> None:
    """Persist the seal of ``sup`` at location ``root`` (atomic replace)."""
    body = {"version": SEAL_VERSION, "supervisorTaskId": sup, "subTaskIds": sorted(subs)}
    write_json_atomic(seals_dir(root), f"{sup}.json", body, fsync)


def remove_seal(root: Path, sup: str) -> None:
    """Forget the seal of ``sup`` at ``root`` (idempotent)."""
    try:
        os.unlink(seals_dir(root) / f"{sup}.json")
    except FileNotFoundError:
        pass


def read_seals(root: Path) -> dict[str, frozenset[str]]:
    """Every seal stored at ``root``; leftover temporary files are removed."""
    directory = seals_dir(root)
    if not directory.is_dir():
        return {}
    out: dict[str, frozenset[str]] = {}
    for name in sorted(os.listdir(directory)):
        path = directory / name
        if name.startswith("."):
            path.unlink(missing_ok=True)  # an interrupted write: the seal was not answered
            continue
        body = json.loads(path.read_text(encoding="utf-8"))
        if body.get("version") != SEAL_VERSION:
            raise ValueError(f"{path}: seal version {body.get('version')!r}, this daemon "
                             f"reads version {SEAL_VERSION}; upgrade the daemon")
        out[str(body["supervisorTaskId"])] = frozenset(body["subTaskIds"])
    return out


FAILED_MARKS = 100_000  # failed tasks remembered at most (oldest forgotten first)


class Seals:
    """The seals of the tasks held, in memory and durable on every healthy location (event
    loop; file work on the I/O threads). A task's seal is changed under its lock.

    Also the tasks marked failed (by their supervisor, or by their DELETE): a failed task is
    never complete and cannot be sealed. Those marks are kept in memory only, bounded by
    count and by ``mark_ttl`` seconds (a supervisor that failed a task deletes it; the mark
    only has to outlive the readers still asking), not on disk like a seal."""

    def __init__(self, *, locations: Sequence[Location], threads: IoThreads, uploads: Uploads,
                 book: TaskBook, fsync: bool, mark_ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.locations = list(locations)
        self.threads = threads
        self.uploads = uploads
        self.book = book
        self.fsync = fsync
        self.sealed: dict[str, frozenset[str]] = {}
        self.mark_ttl = mark_ttl
        self.clock = clock
        self._failed: OrderedDict[str, float] = OrderedDict()
        self._deleted: set[str] = set()  # marks that a DELETE set, not a verdict

    def mark_failed(self, sup: str, *, deleted: bool = False) -> None:
        """``sup`` failed (``deleted``: its DELETE): its reads never complete, and it cannot
        be sealed. A verdict (``POST /fail``) also refuses uploads; a DELETE does not: a
        task id used again (a rerun) starts a new life with its first upload."""
        self._failed.pop(sup, None)
        self._failed[sup] = self.clock()
        if deleted:
            self._deleted.add(sup)
        else:
            self._deleted.discard(sup)
        while len(self._failed) > FAILED_MARKS:
            self._deleted.discard(self._failed.popitem(last=False)[0])

    def refuses_uploads(self, sup: str) -> bool:
        """Whether ``sup`` was failed by its supervisor's verdict (not only deleted)."""
        return self.failed(sup) and sup not in self._deleted

    def revive(self, sup: str) -> None:
        """An upload to a deleted task: the id lives again (its reads are no longer
        "failed")."""
        if sup in self._deleted:
            self._deleted.discard(sup)
            self._failed.pop(sup, None)

    def failed(self, sup: str) -> bool:
        marked = self._failed.get(sup)
        if marked is None:
            return False
        if self.clock() - marked > self.mark_ttl:
            del self._failed[sup]
            self._deleted.discard(sup)
            return False
        return True

    async def load(self) -> None:
        """Read every location's seals at start (a task held from then on, even empty)."""
        for loc in self.locations:
            for sup, subs in (await self.threads.run(read_seals, loc.path)).items():
                # Seals only grow: a location that missed an extension has a subset.
                self.sealed[sup] = self.sealed.get(sup, frozenset()) | subs
                self.book.ensure(sup)

    async def seal(self, sup: str, sub_task_ids: Sequence[str]) -> bool:
        """Record that exactly ``sub_task_ids`` of the task are committed, durably on every
        healthy location. True if new, False if the same seal was already there (a retry);
        a seal that adds subtasks to the known one extends it (a supervisor that recomputed
        lost subtasks seals their replacements, docs/failover.md); any other different one
        is a Conflict: a committed subtask is never taken back. A task not held yet is held
        from now on (empty), so that expiry and DELETE remove its seal like any data."""
        subs = frozenset(sub_task_ids)
        if self.failed(sup):
            raise Conflict(f"{sup} was marked failed (or deleted): it cannot be sealed")
        async with self.uploads.lock(sup):
            known = self.sealed.get(sup)
            if known is not None:
                if not known <= subs:
                    raise Conflict(f"{sup} is already sealed with {len(known - subs)} "
                                   "subtasks this seal leaves out; a seal may only add "
                                   "subtasks", sealed=sorted(known)[:100])
                if known == subs:
                    return False
            written = 0
            failure: OSError | None = None
            for loc in self.locations:
                if not loc.healthy:
                    continue
                try:
                    await self.threads.run(write_seal, loc.path, sup, subs, self.fsync)
                    written += 1
                except OSError as exc:
                    failure = failure or exc
            if not written:
                raise translate(failure or OSError("no healthy location"), "locations",
                                f"sealing supervisor task {sup}")
            self.sealed[sup] = subs
            self.book.ensure(sup)
            self.book.touch(sup)
        return True

    async def remove(self, sup: str) -> None:
        """Forget the task's seal everywhere (its data is gone; the caller holds its lock)."""
        if self.sealed.pop(sup, None) is None:
            return
        for loc in self.locations:
            try:
                await self.threads.run(remove_seal, loc.path, sup)
            except OSError as exc:  # a stale seal is harmless: the data is gone
                log.warning("could not remove the seal of %s at %s: %s", sup, loc.path, exc)
