"""Commit records: what a group commit made durable, written into the pack itself (storage
format 5), so that the pack, not the catalog, is the truth about what was committed.

A partial's bytes and the record naming it are synced by one ``fdatasync`` of their pack;
the catalog transaction that follows does not wait for its own WAL fsync. A power loss can
then leave a catalog older than its packs: at start, the records past the last body the
catalog knows in each pack are read back and their rows restored
(:mod:`shuffled.storage.lifecycle.reconcile`), before anything is served.

A record sits between bodies, after the partials it names (never inside a byte range that
is served: reads are by the catalog's offsets, and bodies on either side of a record are
not adjacent, so no coalesced range reaches it)::

    magic (8) | payload length (u32) | rows (u32) | payload | MAC (16)

The payload is one entry per partial: its key, generation, where its schema and body are,
its sizes and digests (:data:`_ENTRY`, then the subtask id). The MAC is BLAKE2b keyed with
the location's commit key (:func:`load_key`) over the pack's identity (task, number), the
record's offset and the record: a client's body that happens, or is made, to contain a
record's bytes is never taken for one, since no client knows the key, and a record is
valid only where it was written. Records are found at start by their magic and kept only
if their MAC holds, so a torn tail (a record half-written when the power went) is ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import mmap
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shuffled.storage.ondisk import layout
from shuffled.storage.ondisk.records import CatalogRow

log = logging.getLogger("shuffled.storage")

MAGIC = b"\x00SHFCMT\x05"
_HEAD = struct.Struct("<8sII")
# start, end, partitionId, generation, offset, size, rows, crc, schema_len, schema_crc,
# body_crc, has dictionaries, created, schema_at, length of the subtask id
_ENTRY = struct.Struct("<qqqqqqqIIIIBdqH")
MAC_LEN = 16
KEY_NAME = "commit.key"
KEY_LEN = 32
#: A record's payload is refused past this (a group's record for one pack is far smaller:
#: ~90 bytes a partial): a damaged length cannot make the start read gigabytes.
MAX_PAYLOAD = 64 << 20


def key_path(root: Path) -> Path:
    return layout.meta_dir(root) / KEY_NAME


def write_key(root: Path, fsync: bool) -> bytes:
    """Make the location's commit key (atomically); returns it."""
    key = secrets.token_bytes(KEY_LEN)
    layout.write_meta(root, KEY_NAME, key, fsync, mode=0o600)
    return key


def load_key(root: Path, fsync: bool) -> bytes:
    """The location's commit key. A missing one is made again, with a warning: records
    written under the lost key can no longer be read back, which costs nothing while the
    catalog is current (it is after any clean stop)."""
    try:
        key = key_path(root).read_bytes()
    except FileNotFoundError:
        log.warning("%s: the commit key is missing; a new one is made (commit records "
                    "written before cannot restore a catalog that lags its packs)", root)
        return write_key(root, fsync)
    if len(key) != KEY_LEN:
        raise ValueError(f"{key_path(root)} is not a commit key ({len(key)} bytes)")
    return key


def _mac(key: bytes, sup: str, pack: int, at: int, record: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=MAC_LEN, person=b"shuffled-commit")
    h.update(f"{sup}/{pack}@{at}".encode())
    h.update(record)
    return h.digest()


def encode(key: bytes, sup: str, pack: int, at: int, rows: Sequence[CatalogRow]) -> bytes:
    """The record naming ``rows`` (all of ``sup``'s pack ``pack``), to be written at ``at``."""
    pack_entry = _ENTRY.pack
    parts = []
    for r in rows:
        sub = r.sub.encode()
        parts.append(pack_entry(r.start, r.end, r.pid, r.generation, r.offset, r.size, r.rows,
                                r.crc, r.schema_len, r.schema_crc, r.body_crc, r.dicts,
                                r.created, r.schema_at, len(sub)))
        parts.append(sub)
    payload = b"".join(parts)
    record = _HEAD.pack(MAGIC, len(payload), len(rows)) + payload
    return record + _mac(key, sup, pack, at, record)


@dataclass(frozen=True, slots=True)
class Record:
    """A commit record read back: where it is in its pack, and the rows it names."""

    at: int
    end: int
    rows: list[CatalogRow]


def _decode(sup: str, pack: int, payload: memoryview, count: int) -> list[CatalogRow] | None:
    rows, at, size = [], 0, _ENTRY.size
    for _ in range(count):
        if at + size > len(payload):
            return None
        (start, end, pid, generation, offset, length, nrows, crc, schema_len, schema_crc,
         body_crc, dicts, created, schema_at, sub_len) = _ENTRY.unpack_from(payload, at)
        at += size
        if at + sub_len > len(payload):
            return None
        sub = bytes(payload[at: at + sub_len]).decode()
        at += sub_len
        rows.append(CatalogRow(sup, start, end, pid, sub, generation, pack, offset, length,
                               nrows, crc, schema_len, schema_crc, body_crc, dicts, created,
                               schema_at))
    return rows if at == len(payload) else None


def scan(fd: int, start: int, end: int, key: bytes, sup: str, pack: int) -> list[Record]:
    """The valid records in ``[start, end)`` of the pack open as ``fd``, in file order
    (blocking). Bytes that are not a record (bodies, an uncommitted or torn tail) are
    skipped: a candidate is kept only if its MAC holds."""
    if end <= start:
        return []
    found: list[Record] = []
    with mmap.mmap(fd, end, access=mmap.ACCESS_READ) as data:
        view = memoryview(data)
        try:
            at = data.find(MAGIC, start, end)
            while at >= 0:
                record = _read_at(view, at, end, key, sup, pack)
                if record is None:
                    at = data.find(MAGIC, at + 1, end)
                    continue
                found.append(record)
                at = data.find(MAGIC, record.end, end)
        finally:
            view.release()
    return found


def _read_at(view: memoryview, at: int, end: int, key: bytes, sup: str,
             pack: int) -> Record | None:
    if at + _HEAD.size > end:
        return None
    _, length, count = _HEAD.unpack_from(view, at)
    stop = at + _HEAD.size + length + MAC_LEN
    if length > MAX_PAYLOAD or stop > end:
        return None
    record = view[at: stop - MAC_LEN]
    if not hmac.compare_digest(_mac(key, sup, pack, at, record), view[stop - MAC_LEN: stop]):
        return None
    rows = _decode(sup, pack, view[at + _HEAD.size: stop - MAC_LEN], count)
    return None if rows is None else Record(at, stop, rows)
