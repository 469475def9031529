"""The in-memory index: supervisor task -> partition -> subtask -> partial segment facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuffled.protocol import Interval, PartialKey, crc_hex

PartitionSlot = tuple[Interval, int]


@dataclass(slots=True)
class PartialMeta:
    """Everything needed to serve one stored partial segment; persisted as JSON beside it."""

    key: PartialKey
    generation: int
    location: int
    path: Path
    size: int
    rows: int
    crc: int
    schema_len: int
    schema_crc: int
    body_crc: int
    has_dictionaries: bool
    created: float

    @property
    def etag(self) -> str:
        # Strong validator (RFC 9110 section 8.8.3): content CRC + generation.
        return f'"{crc_hex(self.crc)}-{self.generation:x}"'

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

    @classmethod
    def from_json(cls, data: dict[str, Any], location: int, path: Path) -> PartialMeta:
        key = PartialKey(
            data["supervisorTaskId"], data["subTaskId"],
            Interval.parse(data["start"], data["end"]), int(data["partitionId"]),
        )
        return cls(
            key=key, generation=int(data["generation"]), location=location, path=path,
            size=int(data["bytes"]), rows=int(data["rows"]), crc=int(data["crc32c"], 16),
            schema_len=int(data["schemaLen"]), schema_crc=int(data["schemaCrc32c"], 16),
            body_crc=int(data["bodyCrc32c"], 16),
            has_dictionaries=bool(data["hasDictionaries"]), created=float(data["created"]),
        )


@dataclass(slots=True)
class TaskEntry:
    """One supervisor task's partial segments here, with its access and traffic figures."""

    supervisor_task_id: str
    last_access: float
    partitions: dict[PartitionSlot, dict[str, PartialMeta]] = field(default_factory=dict)
    bytes: int = 0
    files: int = 0
    served_bytes: int = 0
    served_requests: int = 0
    received_bytes: int = 0
    received_partials: int = 0
    # Counts every access (PUT, GET): an expiry decision holds on only if it is unchanged,
    # which equal clock readings could not tell.
    accesses: int = 0

    def add(self, meta: PartialMeta) -> PartialMeta | None:
        """Insert ``meta``; return the entry it replaced (same key), if any."""
        slot = (meta.key.interval, meta.key.partition_id)
        subs = self.partitions.setdefault(slot, {})
        old = subs.get(meta.key.sub_task_id)
        subs[meta.key.sub_task_id] = meta
        self.bytes += meta.size - (old.size if old else 0)
        self.files += 0 if old else 1
        return old

    def get(self, key: PartialKey) -> PartialMeta | None:
        return self.partitions.get((key.interval, key.partition_id), {}).get(key.sub_task_id)

    def all(self) -> list[PartialMeta]:
        return [m for subs in self.partitions.values() for m in subs.values()]
