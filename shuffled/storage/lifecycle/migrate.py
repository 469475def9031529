"""``shuffled migrate``: convert a location to the current storage format (5) in place.

Format 4 (shuffled before commit records) needs no byte moved: the location gains its
commit key (:mod:`shuffled.storage.ondisk.commits`), then the format mark is written. Its
packs hold no records and need none: every row of its catalog was synced at its commit.
A format-4 daemon refuses a format-5 location by its mark, so a catalog that lags its packs
is never opened by a release that would not bring it up to date.

Format 3 (shuffled before slabs) needs no byte moved: the catalog gains its ``slabs`` table,
then the format mark is written (the commit point). A format-3 daemon refuses a format-4
location by its mark, so slabs are never half-seen by an older release.

Format 2 (shuffled 0.1.0: packs, each partial a whole Arrow IPC stream in its pack) needs no
byte moved: a partial's stream ``[offset, offset + size)`` is its schema message
``[offset, offset + schema_len)``, its body, and an end-of-stream marker format 3 no longer
reads, so the catalog gains ``schema_at = offset`` and ``offset`` moves past the schema, in
one SQLite transaction (the new column tells a rerun it was done); then the format mark is
written, the commit point. Interrupted before the mark, the location is still refused and a
rerun finishes the job.

Format 1 (before packs) kept one ``<generation>.arrow`` file and a ``<generation>.json``
sidecar per partial segment under ``<sup>/<start>_<end>/<partitionId>/<subTaskId>/``.
Migration copies each partial's newest generation into packs (whole, so that its catalog row
reads as format 3 does), records it in the catalog, and only then writes the format mark:
the mark is the commit point. Interrupted before it, the location is still format 1 (plus
packs and a catalog that the next run discards and redoes); after it, the old files are
removed. Nothing a client was acknowledged is lost. Run it with the daemon stopped (it takes
the location's lock like a daemon does).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuffled.protocol import Interval
from shuffled.storage.ondisk import commits, layout, packs
from shuffled.storage.ondisk.records import CatalogRow
from shuffled.storage.catalog import Catalog
from shuffled.storage.location import Location
from shuffled.storage.ondisk import slabrows as slabrows

log = logging.getLogger("shuffled.storage")
_DATA, _SIDECAR = ".arrow", ".json"
PACK_LIMIT = 1 << 30  # bytes per pack written by the migration


@dataclass
class Migrated:
    location: Path
    partials: int = 0
    bytes: int = 0
    already: bool = False


def _legacy(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every format-1 data file with its sidecar, newest generation per key only."""
    best: dict[tuple[Any, ...], tuple[int, Path, dict[str, Any]]] = {}
    for top in sorted(layout.user_entries(root)):
        for dirpath, _dirs, files in os.walk(root / top):
            for name in files:
                if not name.endswith(_DATA) or not name[: -len(_DATA)].isdigit():
                    continue
                path = Path(dirpath) / name
                try:
                    meta = json.loads(path.with_suffix(_SIDECAR).read_text(encoding="utf-8"))
                    if int(meta["bytes"]) != path.stat().st_size:
                        raise ValueError("size differs from its sidecar")
                except (OSError, ValueError, KeyError) as exc:
                    log.warning("not migrating %s: unreadable metadata (%s)", path, exc)
                    continue
                key = (meta["supervisorTaskId"], meta["subTaskId"], meta["start"],
                       meta["end"], int(meta["partitionId"]))
                held = best.get(key)
                if held is None or int(meta["generation"]) > held[0]:
                    best[key] = (int(meta["generation"]), path, meta)
    for key in sorted(best):
        _, path, meta = best[key]
        yield path, meta


def _discard_attempt(root: Path) -> None:
    """Remove packs and a catalog an interrupted migration left (no format mark yet)."""
    shutil.rmtree(layout.meta_dir(root), ignore_errors=True)
    for top in layout.user_entries(root):
        directory = root / top
        if directory.is_dir():
            for item in directory.iterdir():
                if layout.pack_number(item.name) is not None:
                    item.unlink()


def migrate_location(root: Path, fsync: bool = True,
                     progress: Callable[[str], None] = lambda _m: None) -> Migrated:
    """Convert ``root`` in place (blocking). Idempotent: a format-2 location keeps its
    packs (only format-1 files left by a run interrupted after its commit point go)."""
    done = Migrated(root)
    location = Location(0, root, None, 0)
    location.open()  # the exclusive lock: refuses while a daemon uses the location
    try:
        found = layout.read_format(root)
        if found in (2, 3, 4):
            if found == 2:
                done.partials = _catalog_2_to_3(root, fsync)
                progress(f"{root}: storage format 2 -> 3: {done.partials} partial segments "
                         f"(catalog rewritten, no data moved)")
            if found in (2, 3):
                _catalog_3_to_4(root, fsync)
                progress(f"{root}: storage format 3 -> 4: the catalog gained its slabs table "
                         f"(no data moved)")
            commits.write_key(root, fsync)
            layout.write_format(root, fsync)  # the commit point
            progress(f"{root}: storage format 4 -> {layout.FORMAT_VERSION}: the location's "
                     f"commit key made (no data moved)")
            return done
        if layout.read_format(root) == layout.FORMAT_VERSION:
            # Past the commit point; a run interrupted there may have left old files.
            if _remove_legacy(root):
                progress(f"{root}: removed the format-1 files an interrupted run left")
            done.already = True
            return done
        _discard_attempt(root)
        catalog = Catalog(root, fsync)
        catalog.open()
        try:
            rows = []
            open_packs: dict[str, packs.Pack] = {}
            number = 0
            for path, meta in _legacy(root):
                sup = meta["supervisorTaskId"]
                pack = open_packs.get(sup)
                if pack is None or pack.size >= PACK_LIMIT:
                    if pack is not None:
                        _seal(pack, fsync)
                    number += 1
                    pack = open_packs[sup] = packs.create(root, 0, sup, number, fsync)
                offset = pack.size
                data = path.read_bytes()
                schema_len = int(meta["schemaLen"])
                # Schema message and body in place; the end-of-stream marker is not stored.
                pack.write([memoryview(data)[: len(data) - 8]])
                interval = Interval.parse(meta["start"], meta["end"])
                rows.append(CatalogRow(sup, interval.start, interval.end, int(meta["partitionId"]),
                             meta["subTaskId"], int(meta["generation"]), number,
                             offset + schema_len, int(meta["bytes"]), int(meta["rows"]),
                             int(meta["crc32c"], 16), schema_len,
                             int(meta["schemaCrc32c"], 16), int(meta["bodyCrc32c"], 16),
                             int(bool(meta["hasDictionaries"])), float(meta["created"]),
                             offset))
                done.partials += 1
                done.bytes += int(meta["bytes"])
                if done.partials % 10_000 == 0:
                    progress(f"{root}: {done.partials} partial segments copied")
            for pack in open_packs.values():
                _seal(pack, fsync)
            catalog.insert_many(rows)
        finally:
            catalog.close()
        commits.write_key(root, fsync)
        layout.write_format(root, fsync)  # the commit point
        _remove_legacy(root)
        progress(f"{root}: migrated {done.partials} partial segments ({done.bytes} bytes)")
        return done
    finally:
        location.close()


def _catalog_3_to_4(root: Path, fsync: bool) -> None:
    """Format 4 is format 3 and slabs: the catalog gains its ``slabs`` table (idempotent)."""
    conn = sqlite3.connect(layout.catalog_path(root), isolation_level=None)
    try:
        conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
        conn.executescript(slabrows.SCHEMA)
    finally:
        conn.close()


def _catalog_2_to_3(root: Path, fsync: bool) -> int:
    """Rewrite a format-2 catalog's rows as format 3 reads them (idempotent: a catalog that
    has ``schema_at`` was rewritten by an interrupted run); the number of partials."""
    conn = sqlite3.connect(layout.catalog_path(root), isolation_level=None)
    try:
        conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
        columns = {r[1] for r in conn.execute("PRAGMA table_info(partials)")}
        if "schema_at" not in columns:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # SQLite's DDL is transactional: the column and the new offsets land together.
                conn.execute("ALTER TABLE partials ADD COLUMN schema_at INTEGER NOT NULL "
                             "DEFAULT 0")
                conn.execute('UPDATE partials SET schema_at = "offset", '
                             '"offset" = "offset" + schema_len')
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return int(conn.execute("SELECT COUNT(*) FROM partials").fetchone()[0])
    finally:
        conn.close()


def _remove_legacy(root: Path) -> int:
    """Remove what format 1 kept in task directories; the count. Format 1 kept everything
    in subdirectories (``<start>_<end>/<partitionId>/<subTaskId>/``): those go, and no file
    beside them. (Files went too once, and with them every slab of a location migrated
    again: a second ``shuffled migrate`` on a format-4 location deleted its slabs.)"""
    removed = 0
    for top in layout.user_entries(root):
        directory = root / top
        for item in list(directory.iterdir()) if directory.is_dir() else []:
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item)
                removed += 1
    return removed


def _seal(pack: packs.Pack, fsync: bool) -> None:
    if fsync:
        pack.sync()
    pack.close()
