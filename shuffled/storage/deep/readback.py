"""Reading a pack back from the tier when it is no longer local.

The simplest way that keeps every read path as it is (sendfile, pages, Range, the slow
path's memory map): fetch the whole pack object, decrypt it chunk by chunk into a cache
file under a healthy location's ``.shuffled/deep-cache/<supervisorTaskId>/``, check it
against the CRC32C recorded when it was copied and each partial read against the CRC32C
its upload stored, then rename it into place and serve it like any pack. A cached pack is
used again until the task is deleted (removing its cache too). A cached file name carries
the copy's CRC32C, so a pack copied again after growing is fetched again.

A slab (docs/slab.md) comes back the same way into ``.../<supervisorTaskId>/slabs/``:
checked against the size and CRC32C recorded at the copy, then against the catalog row
it is read with (the row of the daemon's own catalog, or a lost peer's manifest): its
prefix must name the same data section, whose CRC32C must be the row's, and its index
section must be the row's index, byte for byte. So a shard is never read from a slab
other than the one its index describes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from shuffled.crc import crc32c
from shuffled.errors import InvalidBody
from shuffled.protocol import crc_hex
from shuffled.slab import wire
from shuffled.storage.deep import crypt
from shuffled.storage.deep.journal import Copied
from shuffled.storage.deep.tier import Tier
from shuffled.storage.ondisk.layout import meta_dir
from shuffled.storage.ondisk.records import PartialMeta
from shuffled.storage.ondisk.slabrows import SlabRow

CACHE_DIR = "deep-cache"
SLAB_DIR = "slabs"
VERIFY_CHUNK = 1 << 20


class Mismatch(ValueError):
    """What came back is not what was copied."""


def cache_dir(root: Path, sup: str) -> Path:
    return meta_dir(root) / CACHE_DIR / sup


def cache_path(root: Path, sup: str, key: str, copied: Copied) -> Path:
    return cache_dir(root, sup) / f"{key}.{crc_hex(copied.crc)}.pack"


def slab_cache_path(directory: Path, key: str, copied: Copied) -> Path:
    """Where the slab ``key`` (``<location>/<file>``) is read back into, under
    ``directory`` (a task's cache, or a peer's share of it)."""
    location, _, name = key.partition("/")
    return directory / SLAB_DIR / f"{location}.{crc_hex(copied.crc)}.{name}"


def _crc_range(fd: int, offset: int, length: int, crc: int = 0) -> int:
    done = 0
    while done < length:
        chunk = os.pread(fd, min(VERIFY_CHUNK, length - done), offset + done)
        if not chunk:
            raise Mismatch(f"short pack: {length - done} bytes missing at {offset + done}")
        crc = crc32c(chunk, crc)
        done += len(chunk)
    return crc


def _fetch(tier: Tier, key: bytes, sup: str, copied: Copied, dest: Path,
           check: Callable[[Path], None]) -> int:
    """Fetch and decrypt ``copied`` into ``dest`` through a temporary file that ``check``
    passes first (blocking); the bytes (0: ``dest`` was there already)."""
    if dest.exists():
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
    try:
        _download(tier, key, sup, copied, tmp)
        check(tmp)
        os.replace(tmp, dest)
        return copied.size  # as _download checked
    finally:
        tmp.unlink(missing_ok=True)


def fetch(tier: Tier, key: bytes, sup: str, copied: Copied, dest: Path,
          metas: Sequence[PartialMeta]) -> int:
    """Fetch, decrypt and check the pack ``copied`` into ``dest`` (blocking); the bytes."""
    def check(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            for meta in metas:  # the CRC32C each partial's upload stored
                if (_crc_range(fd, meta.schema_at, meta.schema_len) != meta.schema_crc
                        or _crc_range(fd, meta.offset, meta.body_len) != meta.body_crc):
                    raise Mismatch(f"{copied.object}: partial {meta.key} differs from its "
                                   "upload's CRC32C")
        finally:
            os.close(fd)
    return _fetch(tier, key, sup, copied, dest, check)


def _download(tier: Tier, key: bytes, sup: str, copied: Copied, tmp: Path) -> None:
    """Fetch and decrypt ``copied`` into ``tmp``, checked against the copy's size and
    CRC32C (FileNotFoundError if the object is missing)."""
    crc, size = 0, 0
    with open(tmp, "wb") as out:
        for piece in crypt.decrypt_stream(key, sup, copied.object, tier.get(copied.object)):
            out.write(piece)
            crc = crc32c(piece, crc)
            size += len(piece)
    if size != copied.size or crc != copied.crc:
        raise Mismatch(f"{copied.object}: {size} bytes with CRC32C {crc_hex(crc)} came "
                       f"back, {copied.size} with {crc_hex(copied.crc)} were copied")


def check_slab(path: Path, row: SlabRow, name: str) -> None:
    """The slab file at ``path`` is the one ``row`` describes (Mismatch if not)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, wire.PREFIX_LEN, 0)
        try:
            big = 1 << 62
            prefix = wire.parse_prefix(raw, max_index=big, max_stats=big, max_data=big)
        except InvalidBody as exc:
            raise Mismatch(f"{name}: not a slab ({exc.message})") from exc
        size = os.fstat(fd).st_size
        if (prefix.total != size or prefix.data_at != row.data_at
                or prefix.data_len != row.data_len or prefix.index_len != len(row.idx)):
            raise Mismatch(f"{name}: its sections are not where its catalog row says")
        if os.pread(fd, prefix.index_len, prefix.sections_at) != row.idx:
            raise Mismatch(f"{name}: its index differs from its catalog row's")
        if _crc_range(fd, row.data_at, row.data_len) != row.crc:
            raise Mismatch(f"{name}: its data section differs from its upload's CRC32C")
    finally:
        os.close(fd)


def fetch_slab(tier: Tier, key: bytes, sup: str, copied: Copied, dest: Path,
               row: SlabRow) -> int:
    """Fetch, decrypt and check the slab ``copied`` into ``dest`` (blocking); the bytes."""
    return _fetch(tier, key, sup, copied, dest, lambda path: check_slab(path, row, copied.object))
