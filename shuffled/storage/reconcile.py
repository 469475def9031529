"""At start: check a location's format, then make its packs and its catalog agree.

The catalog is the authority on what was committed (a row is written only after its bytes
are synced). What a crash can leave: bytes past a pack's last committed partial (an upload
that never committed: cut off), a pack nothing refers to (removed), rows whose bytes are
gone or damaged (fsync off and a power loss: dropped, never served). The last partial of
each pack is checked against its CRC32C, so a torn tail is found by checksum, not trusted.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from shuffled.errors import ConfigError
from shuffled.storage import layout
from shuffled.storage.catalog import Catalog
from shuffled.storage.slabs import files as slabfiles
from shuffled.storage.streams import crc_of

log = logging.getLogger("shuffled.storage")

#: The last body of a pack is CRC-checked whole up to this size; beyond it only its length
#: is (reading gigabytes at every start would be worse than the risk: with fsync on, a row
#: is committed only after its bytes are synced, so only fsync off and a power loss tear).
VERIFY_TAIL_MAX = 64 << 20


class LegacyLayout(ConfigError):
    """The location holds data in a format this version does not serve."""

    code = "legacy_layout"


def check_format(root: Path, fsync: bool) -> None:
    """Refuse a location in another storage format; mark a new, empty one as ours."""
    try:
        version = layout.read_format(root)
    except ValueError as exc:
        raise LegacyLayout(f"location {root}: {exc}", setting="locations") from exc
    if version == layout.FORMAT_VERSION:
        return
    if version == 3:
        raise LegacyLayout(
            f"location {root} holds storage format 3, written by shuffled before slabs; this "
            f"version reads format {layout.FORMAT_VERSION} (the same packs, and slabs). Stop "
            f"the daemon and run `shuffled migrate --location {root}` to convert it in place "
            f"(it adds a catalog table: seconds, no data moved, nothing is lost)",
            setting="locations", location=str(root))
    if version is not None and version < layout.FORMAT_VERSION:
        raise LegacyLayout(
            f"location {root} holds storage format {version}, written by shuffled 0.1 (each "
            f"partial a whole Arrow stream); this version reads format "
            f"{layout.FORMAT_VERSION} (schemas kept once, bodies contiguous). Stop the daemon "
            f"and run `shuffled migrate --location {root}` to convert it in place (it "
            f"rewrites the catalog only: seconds, nothing is lost), or empty the location if "
            f"the data is no longer needed", setting="locations", location=str(root))
    if version is not None:
        raise LegacyLayout(
            f"location {root} holds storage format {version}, written by a newer shuffled "
            f"(this one reads format {layout.FORMAT_VERSION}); run that version, or give "
            f"this daemon another location", setting="locations", location=str(root))
    entries = layout.user_entries(root)
    if entries:
        raise LegacyLayout(
            f"location {root} holds shuffle data in the storage format of shuffled 0.1 "
            f"(one file per partial segment; e.g. {entries[0]!r}); this version stores packs. "
            f"Stop the daemon and run `shuffled migrate --location {root}` to convert it in "
            f"place (nothing is lost), or empty the location if the data is no longer "
            f"needed", setting="locations", location=str(root))
    layout.write_format(root, fsync)


@dataclass
class Recovered:
    """What reconciling one location found."""

    pack_bytes: dict[str, int] = field(default_factory=dict)  # sup -> bytes of its packs
    max_pack: int = 0
    dropped: int = 0  # committed rows whose bytes were missing or damaged
    cut_bytes: int = 0  # uncommitted tails cut off packs
    orphans: int = 0  # packs holding nothing committed, removed


def _tail_ok(fd: int, offset: int, size: int, crc: int) -> bool:
    if size > VERIFY_TAIL_MAX:
        return True
    got, done = crc_of(fd, offset, size)
    return done == size and got == crc


def _settle(catalog: Catalog, sup: str, number: int, path: Path, found: Recovered) -> int:
    """Make one pack agree with the catalog; returns its length afterwards (0: removed)."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        while True:
            tail = catalog.pack_tail(sup, number)
            if tail is None:
                os.close(fd)
                fd = -1
                os.unlink(path)
                found.orphans += 1
                return 0
            offset, length, crc = tail
            end = offset + length
            if end <= size and _tail_ok(fd, offset, length, crc):
                break
            dropped = catalog.drop_past(sup, number, min(size, offset))
            found.dropped += dropped
            log.warning("%s: dropped %d partial segment(s) whose bytes are missing or fail "
                        "their CRC32C (a crash with fsync off?)", path, dropped)
        if size > end:
            os.ftruncate(fd, end)
            found.cut_bytes += size - end
            log.info("%s: cut %d bytes of uncommitted tail", path, size - end)
        return end
    finally:
        if fd >= 0:
            os.close(fd)


def reconcile(root: Path, catalog: Catalog,
              kept: frozenset[tuple[str, int]] = frozenset()) -> Recovered:
    """Cut torn tails, drop what has no bytes, remove what has no rows (writer thread).
    ``kept`` are (sup, pack) evicted to deep storage: missing on purpose, rows kept."""
    found = Recovered()
    on_disk: set[tuple[str, int]] = set()
    for entry in os.scandir(root):
        if entry.name in layout.RESERVED or not entry.is_dir(follow_symlinks=False):
            continue
        sup = entry.name
        for item in os.scandir(entry.path):
            number = layout.pack_number(item.name)
            if number is None and (slabfiles.parse_name(item.name) is not None
                                   or slabfiles.is_temporary(item.name)):
                continue  # settled by shuffled.storage.slabs.service.reconcile_slabs
            if number is None:
                log.warning("ignoring unexpected file %s", item.path)
                continue
            on_disk.add((sup, number))
            found.max_pack = max(found.max_pack, number)
            length = _settle(catalog, sup, number, Path(item.path), found)
            if length:
                found.pack_bytes[sup] = found.pack_bytes.get(sup, 0) + length
        try:
            os.rmdir(entry.path)  # only succeeds for a task left with no packs
        except OSError:
            pass
    for _, number in kept:
        found.max_pack = max(found.max_pack, number)  # never numbered again
    for sup, number in catalog.packs() - on_disk - kept:
        dropped = catalog.drop_pack(sup, number)
        found.dropped += dropped
        log.warning("pack %s/%s of %s is missing: %d partial segment(s) dropped",
                    sup, number, root, dropped)
    return found
