"""What is offloaded: per supervisor task, durable, so an offload resumes after a restart.

One small JSON file per task in every healthy location's metadata directory
(``<location>/.shuffled/deep/<supervisorTaskId>.json``), written atomically like a seal:
the seal it was made for, each pack copied (its size, CRC32C and object name) and whether
the manifest, written last, completed the task. ``evicted`` names the packs whose local
file was removed to free space (:mod:`.evict`): recovery keeps their catalog rows and reads
serve them from the tier. ``deleting`` marks a task whose prefix in the tier a DELETE or
an expiry has yet to remove (retried by the sweeper and at start); ``everyone`` that it is
the whole ``<sup>/`` prefix, every daemon's copy (a DELETE), not only this daemon's
``<sup>/<instance>/`` (an expiry). ``slabs`` and ``evictedSlabs`` are the same for the
task's slab files (docs/slab.md), keyed ``<location>/<sub>.<slabId>.<attempt>.slab``.
Copies agree but for a location that missed a write: the one of the newest ``updated``
wins. Versioned: a file of another version is refused at start. Version 2 adds the slabs;
an entry without any is still written as version 1, so a daemon of before slabs keeps
reading the journals of tasks of partials only.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuffled.storage.ondisk.layout import meta_dir, write_json_atomic
from shuffled.storage.location import Location
from shuffled.storage.threads import IoThreads

log = logging.getLogger("shuffled.storage")

JOURNAL_VERSION = 2  # version 2: the slabs; 1 (no slabs) is still read and written
READ_VERSIONS = (1, 2)
JOURNAL_DIR = "deep"


@dataclass
class Copied:
    """One pack in the tier: the local file's size and CRC32C when it was copied."""

    object: str
    size: int
    crc: int


@dataclass
class Entry:
    """One task's offload, as far as it went."""

    sup: str
    subs: frozenset[str] = frozenset()  # the seal the copy was made for
    packs: dict[str, Copied] = field(default_factory=dict)  # "<location>.<pack>" -> copy
    complete: bool = False  # the manifest of ``subs`` and ``packs`` is in the tier
    deleting: bool = False
    everyone: bool = False  # the deletion is of every instance's prefix (a DELETE)
    updated: float = 0.0
    evicted: set[str] = field(default_factory=set)  # packs whose local file was removed
    offloaded_at: float = 0.0  # when the copy last completed (eviction takes oldest first)
    slabs: dict[str, Copied] = field(default_factory=dict)  # "<location>/<slab file>" -> copy
    evicted_slabs: set[str] = field(default_factory=set)  # slabs whose local file was removed

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "version": 2 if self.slabs or self.evicted_slabs else 1,
            "supervisorTaskId": self.sup,
            "subTaskIds": sorted(self.subs), "complete": self.complete,
            "deleting": self.deleting, "everyone": self.everyone, "updated": self.updated,
            "evicted": sorted(self.evicted), "offloadedAt": self.offloaded_at,
            "packs": {k: {"object": c.object, "size": c.size, "crc32c": c.crc}
                      for k, c in sorted(self.packs.items())}}
        if body["version"] == 2:
            body["slabs"] = {k: {"object": c.object, "size": c.size, "crc32c": c.crc}
                             for k, c in sorted(self.slabs.items())}
            body["evictedSlabs"] = sorted(self.evicted_slabs)
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any], where: Path) -> Entry:
        if body.get("version") not in READ_VERSIONS:
            raise ValueError(f"{where}: deep-storage journal version {body.get('version')!r}"
                             f", this daemon reads versions {READ_VERSIONS}; upgrade it")
        return cls(sup=str(body["supervisorTaskId"]), subs=frozenset(body["subTaskIds"]),
                   complete=bool(body["complete"]), deleting=bool(body["deleting"]),
                   everyone=bool(body.get("everyone", False)),
                   updated=float(body["updated"]),
                   # Absent from journals written before eviction (same version: nothing
                   # else changed, and an older daemon ignores them).
                   evicted=set(body.get("evicted", [])),
                   offloaded_at=float(body.get("offloadedAt", 0.0)),
                   packs={k: Copied(str(v["object"]), int(v["size"]), int(v["crc32c"]))
                          for k, v in body["packs"].items()},
                   slabs={k: Copied(str(v["object"]), int(v["size"]), int(v["crc32c"]))
                          for k, v in body.get("slabs", {}).items()},
                   evicted_slabs=set(body.get("evictedSlabs", [])))


def journal_dir(root: Path) -> Path:
    return meta_dir(root) / JOURNAL_DIR


def write(root: Path, entry: Entry, fsync: bool) -> None:
    """Persist ``entry`` at location ``root`` (atomic replace)."""
    entry.updated = max(time.time(), entry.updated + 1e-6)
    write_json_atomic(journal_dir(root), f"{entry.sup}.json", entry.to_json(), fsync)


def remove(root: Path, sup: str) -> None:
    try:
        os.unlink(journal_dir(root) / f"{sup}.json")
    except FileNotFoundError:
        pass


def read_all(root: Path) -> dict[str, Entry]:
    """Every entry at ``root``; leftover temporary files are removed."""
    directory = journal_dir(root)
    if not directory.is_dir():
        return {}
    out: dict[str, Entry] = {}
    for name in sorted(os.listdir(directory)):
        path = directory / name
        if name.startswith("."):
            path.unlink(missing_ok=True)
            continue
        entry = Entry.from_json(json.loads(path.read_text(encoding="utf-8")), path)
        out[entry.sup] = entry
    return out


class Journal:
    """The entries in memory (event loop), each saved to every healthy location."""

    def __init__(self, locations: Sequence[Location], threads: IoThreads, fsync: bool) -> None:
        self.locations = list(locations)
        self.threads = threads
        self.fsync = fsync
        self.entries: dict[str, Entry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.loaded = False

    async def load(self) -> None:
        """Read the entries (once: the store reads them before recovery, which must keep
        the rows of evicted packs, and the tier's start finds them read)."""
        if self.loaded:
            return
        self.loaded = True
        for loc in self.locations:
            for sup, entry in (await self.threads.run(read_all, loc.path)).items():
                held = self.entries.get(sup)
                if held is None or entry.updated > held.updated:
                    self.entries[sup] = entry

    async def save(self, entry: Entry) -> None:
        """Persist ``entry`` on every healthy location; OSError if on none."""
        self.entries[entry.sup] = entry
        written, failure = 0, None
        lock = self._locks.setdefault(entry.sup, asyncio.Lock())
        async with lock:  # copies of one task finishing together save one after the other
            for loc in self.locations:
                if not loc.healthy:
                    continue
                try:
                    await self.threads.run(write, loc.path, entry, self.fsync)
                    written += 1
                except OSError as exc:
                    failure = failure or exc
        if not lock.locked():
            self._locks.pop(entry.sup, None)
        if not written:
            raise failure or OSError("no healthy location for the deep-storage journal")

    async def drop(self, sup: str) -> None:
        self.entries.pop(sup, None)
        for loc in self.locations:
            try:
                await self.threads.run(remove, loc.path, sup)
            except OSError as exc:
                log.warning("could not remove the deep-storage journal of %s at %s: %s",
                            sup, loc.path, exc)
