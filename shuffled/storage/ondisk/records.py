"""What the store knows: one partial segment's facts, and one supervisor task's figures.

Partial segments are not held in memory: the catalog (SQLite, one per location) has them and
:class:`PartialMeta` objects are made per query. What stays in memory per supervisor task
(:class:`TaskEntry`) is a handful of counters plus the set of its partitions, so memory grows
with tasks and partitions, not with partial segments.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from shuffled.protocol import PartialKey, crc_hex, interval_of

EOS_LEN = 8  # the Arrow IPC end-of-stream marker, which a stream ends with and packs omit

#: (start ms, end ms, partitionId): a partition of a task, as the catalog orders them.
Slot = tuple[int, int, int]


class CatalogRow(NamedTuple):
    """A partial segment's catalog row (storage format 3 and 4: the ``partials`` table's
    columns, in order). Named, because it crosses from the catalog to the group commit, the
    reads, the start and deep storage; a tuple, because a million of them may be read."""

    sup: str
    start: int
    end: int
    pid: int
    sub: str
    generation: int
    pack: int
    offset: int  # where its body starts in the pack
    size: int  # the whole stream's length
    rows: int
    crc: int
    schema_len: int
    schema_crc: int
    body_crc: int
    dicts: int
    created: float
    schema_at: int  # where its schema message is in the pack

    @property
    def key(self) -> tuple[str, int, int, int, str]:
        """(sup, start, end, partitionId, subTaskId): the partial's identity."""
        return (self.sup, self.start, self.end, self.pid, self.sub)

    @property
    def slot(self) -> tuple[int, int, int]:
        """(start, end, partitionId): its partition within the task."""
        return (self.start, self.end, self.pid)


def slot_key(start: int, end: int, partition_id: int) -> int:
    """A partition as one int, for the per-task set in memory: about 70 bytes a partition
    with the set's table, against 160 for a tuple of three ints (a million partitions held
    is the design's case). Exact: the length of the interval and the id get their own bits."""
    return (start << 96) | ((end - start) << 32) | partition_id


@dataclass(slots=True, kw_only=True)
class PartialMeta:
    """Everything needed to serve one stored partial segment (storage format 3).

    The partial is the Arrow IPC stream it was uploaded as, ``size`` bytes with CRC32C
    ``crc``, stored in the pack file ``path`` in two ranges: its schema message, ``schema_len``
    bytes at ``schema_at`` (shared by the partials of the pack with the same schema), and its
    body, the dictionary and record batch messages, ``body_len`` bytes at ``offset``; the
    end-of-stream marker is not stored. Bodies of consecutive uploads are adjacent, so a
    partition's partials written together are one byte range (:mod:`shuffled.storage.read.streams`)."""

    key: PartialKey
    generation: int
    location: int
    path: Path
    offset: int
    size: int
    rows: int
    crc: int
    schema_len: int
    schema_crc: int
    body_crc: int
    has_dictionaries: bool
    created: float
    pack: int = 0
    schema_at: int = 0
    stored: int = 0  # pack bytes its upload appended (0 when read from the catalog)

    @property
    def body_len(self) -> int:
        return self.size - self.schema_len - EOS_LEN

    @property
    def etag(self) -> str:
        # Strong validator (RFC 9110 section 8.8.3): content CRC + generation.
        return f'"{crc_hex(self.crc)}-{self.generation:x}"'

    @property
    def slot(self) -> Slot:
        return (self.key.interval.start, self.key.interval.end, self.key.partition_id)

    @property
    def slot_key(self) -> int:
        return slot_key(*self.slot)

    def to_json(self) -> dict[str, Any]:
        return {
            "supervisorTaskId": self.key.supervisor_task_id,
            "subTaskId": self.key.sub_task_id,
            "start": self.key.interval.start_iso,
            "end": self.key.interval.end_iso,
            "partitionId": self.key.partition_id,
            "generation": self.generation,
            "bytes": self.size,
            "rows": self.rows,
            "crc32c": crc_hex(self.crc),
            "schemaLen": self.schema_len,
            "schemaCrc32c": crc_hex(self.schema_crc),
            "bodyCrc32c": crc_hex(self.body_crc),
            "hasDictionaries": self.has_dictionaries,
            "created": self.created,
        }

    def row(self) -> CatalogRow:
        """Its catalog row."""
        k = self.key
        return CatalogRow(k.supervisor_task_id, k.interval.start, k.interval.end, k.partition_id,
                k.sub_task_id, self.generation, self.pack, self.offset, self.size, self.rows,
                self.crc, self.schema_len, self.schema_crc, self.body_crc,
                int(self.has_dictionaries), self.created, self.schema_at)

    @classmethod
    def from_row(cls, row: CatalogRow, location: int, root: Path) -> PartialMeta:
        (sup, start, end, pid, sub, generation, pack, offset, size, rows, crc, schema_len,
         schema_crc, body_crc, dicts, created, schema_at) = row
        # PartialKey validates the ids again: a catalog edited by hand must not smuggle a
        # path component through.
        key = PartialKey(sup, sub, interval_of(start, end), pid)
        return cls(key=key, generation=generation, location=location,
                   path=pack_path(root, sup, pack), offset=offset, size=size, rows=rows,
                   crc=crc, schema_len=schema_len, schema_crc=schema_crc, body_crc=body_crc,
                   has_dictionaries=bool(dicts), created=created, pack=pack,
                   schema_at=schema_at)


@functools.lru_cache(maxsize=4096)
def pack_path(root: Path, supervisor_task_id: str, pack: int) -> Path:
    """``root/<sup>/<pack>.pack``, one object per pack: a read looks up thousands of
    partials in a few packs, and building a Path per partial was the largest cost of
    serving small partials (bench.units, comparison 7)."""
    return root / supervisor_task_id / f"{pack}.pack"


@dataclass(slots=True)
class TaskEntry:
    """One supervisor task held here: its figures, access count and partitions."""

    supervisor_task_id: str
    last_access: float
    bytes: int = 0  # bytes of the partial segments held (replaced ones not counted)
    files: int = 0  # partial segments held
    slots: set[int] = field(default_factory=set)  # slot_key() of each partition
    # Pack bytes per location index, replaced partials' bytes included: reclaimed at delete.
    pack_bytes: dict[int, int] = field(default_factory=dict)
    files_at: dict[int, int] = field(default_factory=dict)  # partials per location index
    served_bytes: int = 0
    served_requests: int = 0
    received_bytes: int = 0
    received_partials: int = 0
    # Counts every access (PUT, GET): an expiry decision holds on only if it is unchanged,
    # which equal clock readings could not tell.
    accesses: int = 0

    @property
    def partitions(self) -> int:
        return len(self.slots)
