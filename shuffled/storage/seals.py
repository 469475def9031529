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
import os
from pathlib import Path

from shuffled.storage.layout import fsync_dir, meta_dir

SEAL_VERSION = 1
SEALS_DIR = "seals"


def seals_dir(root: Path) -> Path:
    return meta_dir(root) / SEALS_DIR


def write_seal(root: Path, sup: str, subs: frozenset[str], fsync: bool) -> None:
    """Persist the seal of ``sup`` at location ``root`` (atomic replace)."""
    directory = seals_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{sup}.json"
    tmp = path.with_name(f".{sup}.json.tmp")
    body = {"version": SEAL_VERSION, "supervisorTaskId": sup, "subTaskIds": sorted(subs)}
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(body, fh)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(directory)


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
