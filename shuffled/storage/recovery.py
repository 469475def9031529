"""Rebuild the index from disk at start: data survives restarts and rolling upgrades."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from shuffled.errors import ShuffleError
from shuffled.storage import layout
from shuffled.storage.index import PartialMeta
from shuffled.storage.location import LOCK_NAME, TMP_DIR, Location

log = logging.getLogger("shuffled.storage")


@dataclass
class Recovered:
    partials: list[PartialMeta] = field(default_factory=list)
    dropped: int = 0  # sidecars without data, unreadable sidecars, stale generations


def _scan_dir(directory: Path, location: Location, found: Recovered) -> None:
    names = os.listdir(directory)
    name_set = set(names)
    for name in names:
        path = directory / name
        if name.endswith(".json.tmp"):
            os.unlink(path)
            found.dropped += 1
            continue
        if name.endswith(layout.META_SUFFIX):
            data_name = name[: -len(layout.META_SUFFIX)] + layout.DATA_SUFFIX
            if data_name not in name_set:  # crash between the two renames
                os.unlink(path)
                found.dropped += 1
            continue
        if layout.generation_of(name) is None:
            continue
        meta_file = layout.meta_path(path)
        try:
            with open(meta_file, encoding="utf-8") as fh:
                meta = PartialMeta.from_json(json.load(fh), location.index, path)
            if meta.size != path.stat().st_size:
                raise ValueError(f"size {path.stat().st_size} != recorded {meta.size}")
        except (OSError, ValueError, KeyError, ShuffleError) as exc:
            log.warning("dropping %s: unreadable metadata (%s)", path, exc)
            for victim in (path, meta_file):
                try:
                    os.unlink(victim)
                except FileNotFoundError:
                    pass
            found.dropped += 1
            continue
        found.partials.append(meta)


def scan(location: Location) -> Recovered:
    """Every committed partial segment in ``location`` (blocking)."""
    found = Recovered()
    for top in os.scandir(location.path):
        if top.name in (LOCK_NAME, TMP_DIR) or not top.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(top.path):
            if filenames:
                _scan_dir(Path(dirpath), location, found)
    return found


def newest_only(partials: list[PartialMeta]) -> tuple[list[PartialMeta], list[PartialMeta]]:
    """Split into (newest generation per key, older generations to delete)."""
    best: dict[object, PartialMeta] = {}
    stale: list[PartialMeta] = []
    for meta in partials:
        current = best.get(meta.key)
        if current is None or meta.generation > current.generation:
            if current is not None:
                stale.append(current)
            best[meta.key] = meta
        else:
            stale.append(meta)
    return list(best.values()), stale
