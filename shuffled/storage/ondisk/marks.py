"""Durable per-task marks: one small JSON file per task and kind in a location's metadata
directory, ``<location>/.shuffled/<kind>/<supervisorTaskId>.json``.

Three kinds, each a state that must survive a restart:

- ``seals``: the subtasks its supervisor committed (:mod:`shuffled.storage.tasks.seals`);
- ``failed``: its supervisor's fail verdict (:mod:`shuffled.storage.tasks.seals`);
- ``deleting``: a DELETE (or an expiry) under way, the tombstone that makes removing a
  task across locations atomic: written everywhere before anything is removed, removed
  only once everything is, and finished at start if a crash came between
  (:mod:`shuffled.storage.lifecycle.removal`).

Writes are atomic (a temporary file renamed over the mark) and, with ``fsync``, synced
with their directory before the caller answers; a removal is synced too, since a mark that
came back after a crash would fail, seal or delete a task id used again since. Each file
carries :data:`MARK_VERSION`; a file of another version is refused at start with a
message, never silently read. (Seals were written in this form since format 3: version 1
with ``supervisorTaskId`` and ``subTaskIds``.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shuffled.storage.ondisk.layout import fsync_dir, meta_dir, write_json_atomic
from shuffled.storage.location import Location
from shuffled.storage.oserrors import translate
from shuffled.storage.threads import IoThreads

MARK_VERSION = 1
SEALS = "seals"
FAILED = "failed"
DELETING = "deleting"
KINDS = (SEALS, FAILED, DELETING)


def mark_dir(root: Path, kind: str) -> Path:
    return meta_dir(root) / kind


def write(root: Path, kind: str, sup: str, fields: dict[str, Any], fsync: bool) -> None:
    """Mark ``sup`` with ``kind`` at location ``root`` (atomic replace)."""
    body = {"version": MARK_VERSION, "supervisorTaskId": sup, **fields}
    write_json_atomic(mark_dir(root, kind), f"{sup}.json", body, fsync)


async def write_everywhere(locations: Sequence[Location], threads: IoThreads, kind: str,
                           sup: str, fields: dict[str, Any], fsync: bool, doing: str) -> None:
    """Mark ``sup`` with ``kind`` on every healthy location (on the I/O threads); at least
    one must take it, else the first failure is raised as the domain error of ``doing``
    (e.g. "sealing"), and the caller has changed nothing."""
    written = 0
    failure: OSError | None = None
    for loc in locations:
        if not loc.healthy:
            continue
        try:
            await threads.run(write, loc.path, kind, sup, fields, fsync)
            written += 1
        except OSError as exc:
            failure = failure or exc
    if not written:
        raise translate(failure or OSError("no healthy location"), "locations",
                        f"{doing} supervisor task {sup}")


def remove(root: Path, kind: str, sup: str, fsync: bool) -> bool:
    """Remove ``sup``'s mark of ``kind`` at ``root`` (idempotent); whether one was there."""
    directory = mark_dir(root, kind)
    try:
        os.unlink(directory / f"{sup}.json")
    except FileNotFoundError:
        return False
    if fsync:
        fsync_dir(directory)
    return True


def read_all(root: Path, kind: str) -> dict[str, dict[str, Any]]:
    """Every mark of ``kind`` at ``root`` by task; leftover temporary files are removed
    (an interrupted write: its request was not answered)."""
    directory = mark_dir(root, kind)
    if not directory.is_dir():
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(os.listdir(directory)):
        path = directory / name
        if name.startswith("."):
            path.unlink(missing_ok=True)
            continue
        body = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(body, dict) or body.get("version") != MARK_VERSION:
            version = body.get("version") if isinstance(body, dict) else None
            raise ValueError(f"{path}: {kind} mark version {version!r}, this daemon reads "
                             f"version {MARK_VERSION}; upgrade the daemon")
        out[str(body["supervisorTaskId"])] = body
    return out
