"""At start: check a location's format, then make its packs and its catalog agree.

The packs are the authority on what was committed: a group commit syncs a pack's partials
and the commit record naming them, then writes their catalog rows without waiting for the
WAL's fsync (:mod:`shuffled.storage.ondisk.commits`). So the catalog may lag its packs after
a power loss: the records past the last body the catalog knows in each pack are read back
and their rows restored first, each row's schema message and body checked against their
CRC32C (a record naming bytes that fail was never acknowledged: it and what follows it are
ignored), after the catalog's own WAL is checkpointed, so that every row is durable again
before any byte is cut off. What a crash can leave besides: bytes past a pack's last
committed partial and good record (an upload that never committed: cut off), a pack nothing
refers to (removed), rows whose bytes are gone or damaged (fsync off and a power loss:
dropped, never served). The last partial of each pack is checked against its CRC32C, so a
torn tail is found by checksum, not trusted.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from shuffled.errors import ConfigError
from shuffled.storage.ondisk import commits, layout
from shuffled.storage.catalog import Catalog, Row
from shuffled.storage.ondisk.arrowfile import EOS
from shuffled.storage.slabs import files as slabfiles
from shuffled.storage.read.streams import crc_of

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
    if version == 4:
        raise LegacyLayout(
            f"location {root} holds storage format 4, written by shuffled before commit "
            f"records; this version reads format {layout.FORMAT_VERSION} (the same packs "
            f"and slabs, each group commit recorded in its pack). Stop the daemon and run "
            f"`shuffled migrate --location {root}` to convert it in place (it makes the "
            f"location's commit key: no data moved, nothing is lost)",
            setting="locations", location=str(root))
    if version == 3:
        raise LegacyLayout(
            f"location {root} holds storage format 3, written by shuffled before slabs; this "
            f"version reads format {layout.FORMAT_VERSION} (the same packs, and slabs). Stop "
            f"the daemon and run `shuffled migrate --location {root}` to convert it in place "
            f"(it adds a catalog table and a key: seconds, no data moved, nothing is lost)",
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
    commits.write_key(root, fsync)
    layout.write_format(root, fsync)


@dataclass
class Recovered:
    """What reconciling one location found."""

    pack_bytes: dict[str, int] = field(default_factory=dict)  # sup -> bytes of its packs
    max_pack: int = 0
    dropped: int = 0  # committed rows whose bytes were missing or damaged
    restored: int = 0  # rows the catalog had lost, read back from commit records
    cut_bytes: int = 0  # uncommitted tails cut off packs
    orphans: int = 0  # packs holding nothing committed, removed


def _crc_ok(fd: int, offset: int, length: int, crc: int) -> bool:
    """Whether ``length`` bytes at ``offset`` are there and have CRC32C ``crc``."""
    got, done = crc_of(fd, offset, length)
    return done == length and got == crc


def _tail_ok(fd: int, offset: int, size: int, crc: int) -> bool:
    return size > VERIFY_TAIL_MAX or _crc_ok(fd, offset, size, crc)


def _restore(catalog: Catalog, key: bytes, sup: str, number: int, fd: int, size: int,
             found: Recovered, path: Path) -> int:
    """Bring the catalog up to date with the pack's commit records past the last body it
    knows (a synced transaction); where the last good record ends (0: none)."""
    tail = catalog.pack_tail(sup, number)
    start = tail[0] + tail[1] if tail is not None else 0
    if not key or size <= start:
        return 0
    rows: list[Row] = []
    end = 0
    for record in commits.scan(fd, start, size, key, sup, number):
        # Only what the catalog lacks is read back and checked: rows it holds (or holds
        # newer) cost no read of their bodies at every start.
        lacking = catalog.lacking(record.rows)
        # Synced with its bodies before anything was acknowledged: bodies that fail their
        # CRC mean that sync never finished, and no later record was written after it.
        if not all(_body_ok(fd, row, size) for row in lacking):
            log.warning("%s: a commit record at %d names bytes that fail their CRC32C (a "
                        "group commit torn by a crash); it and what follows are ignored",
                        path, record.at)
            break
        rows.extend(lacking)
        end = record.end
    if rows:
        restored = catalog.restore(rows)
        if restored:
            found.restored += restored
            log.warning("%s: restored %d partial segment(s) the catalog had lost (a power "
                        "loss after their commit?) from the pack's commit records",
                        path, restored)
    return end


def _body_ok(fd: int, row: Row, size: int) -> bool:
    """Whether a restored row's schema message and body are in the pack, whole."""
    length = row.size - row.schema_len - len(EOS)
    if row.offset + length > size or row.schema_at + row.schema_len > size:
        return False
    return (_crc_ok(fd, row.schema_at, row.schema_len, row.schema_crc)
            and _crc_ok(fd, row.offset, length, row.body_crc))


def _settle(catalog: Catalog, sup: str, number: int, path: Path, found: Recovered,
            key: bytes) -> int:
    """Make one pack agree with the catalog; returns its length afterwards (0: removed)."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        records_end = _restore(catalog, key, sup, number, fd, size, found, path)
        damaged = False
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
            damaged = True
            log.warning("%s: dropped %d partial segment(s) whose bytes are missing or fail "
                        "their CRC32C (a crash with fsync off?)", path, dropped)
        # Good records past the last body stay (a copy in deep storage has them: the pack
        # keeps the length it had); what is past them was never committed. Past a damaged
        # tail nothing stays: its records name bytes that were just dropped (the catalog
        # is durable, so they are not needed for the rows it keeps).
        if not damaged:
            end = max(end, records_end)
        if size > end:
            os.ftruncate(fd, end)
            found.cut_bytes += size - end
            log.info("%s: cut %d bytes of uncommitted tail", path, size - end)
        return end
    finally:
        if fd >= 0:
            os.close(fd)


def reconcile(root: Path, catalog: Catalog,
              kept: frozenset[tuple[str, int]] = frozenset(), key: bytes = b"") -> Recovered:
    """Restore rows from commit records, cut torn tails, drop what has no bytes, remove
    what has no rows (writer thread). ``kept`` are (sup, pack) evicted to deep storage:
    missing on purpose, rows kept. ``key``: the location's commit key (none: the catalog
    is taken as it is)."""
    found = Recovered()
    # Every row the catalog holds made durable first: a tail cut back past a record (a
    # damaged last partial dropped) then loses nothing a row still needs.
    catalog.make_durable()
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
            length = _settle(catalog, sup, number, Path(item.path), found, key)
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
