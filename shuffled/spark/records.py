"""What crosses between phase 1, the driver and phase 2: typed records, serialised here only.

Spark hands a task's result to the driver as lines of text (a data source's commit message,
``collect``), so each record is one JSON object: ``{"v": 1, "kind": ..., <fields>}``, field
names in camelCase as the task report has them. :func:`dump` and :func:`load` are the only
code that writes or reads that form; a line of another version is refused by name (a driver
and executors of different releases must not silently misread each other).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Union

VERSION = 1

#: (start ms, end ms, partitionId): one output partition of phase 1 / one segment.
PartitionId = tuple[int, int, int]


@dataclass(frozen=True)
class Partial:
    """One partial a committed phase-1 attempt uploaded (a subtask's flush, one partition)."""

    task: int  # the Spark partition (phase-1 subtask) that wrote it
    server: str  # the daemon its upload's answers came from
    replicas: tuple[str, ...]  # every daemon holding it
    sub: str  # its subTaskId: p<task>-a<attempt>-f<flush>
    start: int
    end: int
    partition: int
    rows: int
    bytes: int
    crc32c: str | None = None

    @property
    def key(self) -> PartitionId:
        return (self.start, self.end, self.partition)


@dataclass(frozen=True)
class SlabSent:
    """One slab a committed phase-1 attempt stored (a flush, every chunk and key of it)."""

    task: int  # the Spark partition (phase-1 subtask) that wrote it
    server: str  # the daemon that stored it
    sub: str  # its subTaskId: p<task>-a<attempt> (one per attempt, sealed by name)
    slab: int  # its slabId: the flush's number in the attempt
    attempt: int
    rows: int
    bytes: int
    chunks: int
    replicas: tuple[str, ...] = ()  # every daemon holding it (shuffleReplicas > 1)
    # The start of its first and last time chunk (ms): what a re-run of its subtask can
    # change (None: unknown, every chunk)
    first_chunk: int | None = None
    last_chunk: int | None = None

    @property
    def holders(self) -> tuple[str, ...]:
        return self.replicas or (self.server,)


@dataclass(frozen=True)
class TaskStats:
    """What a phase-1 attempt did (its last line)."""

    partition: int
    attempt: int
    attempt_number: int
    server: str
    servers_down: tuple[str, ...] = ()
    ms: int = 0
    # the first parse exceptions: file, line, message, raw, errorType (unparseable or
    # processedWithError, as Druid's saved parse exceptions)
    bad: tuple[dict[str, Any], ...] = ()
    peak_rss: int = 0
    rss_at_start: int = 0
    multi_value: tuple[str, ...] = ()
    rows_in: int = 0
    processed: int = 0
    processed_with_error: int = 0  # ingested with a column's value null (a parse error)
    unparseable: int = 0
    thrown_away: int = 0
    bytes_processed: int = 0
    bytes_shuffled: int = 0
    bytes_before_compression: int = 0
    rows_shipped: int = 0
    bytes_replicated: int = 0
    replication_ms: int = 0
    failovers: int = 0


@dataclass(frozen=True)
class Declined:
    """A native phase-1 task met input its reader does not read (the JVM reads it again)."""

    reason: str


@dataclass(frozen=True)
class Segment:
    """One partition merged and written by a phase-2 attempt: its segment file."""

    start: int
    end: int
    partition: int
    rows: int
    rows_in: int
    bytes: int
    path: str
    attempt: int
    bytes_fetched: int = 0
    fetch_ms: float = 0.0
    merge_ms: float = 0.0
    write_ms: float = 0.0
    ms: int = 0
    peak_rss: int = 0
    rss_at_start: int = 0
    spill_files: int | None = None
    spill_bytes: int | None = None
    bucket: int | None = None  # dynamic partitioning: the partition before renumbering
    pages: int = 0  # slabs: key ranges a shard too big for the budget was read in (0: one)
    # the routes to lost daemons' shares in deep storage this attempt had read through
    from_tier: tuple[str, ...] = ()

    @property
    def key(self) -> PartitionId:
        return (self.start, self.end, self.partition)


@dataclass(frozen=True)
class Lost:
    """A partition a phase-2 attempt could not read: the daemons gone, why."""

    start: int
    end: int
    partition: int
    attempt: int
    lost: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # of those, the ones that answered without the rows
    why: str = ""

    @property
    def key(self) -> PartitionId:
        return (self.start, self.end, self.partition)


Record = Union[Partial, SlabSent, TaskStats, Declined, Segment, Lost]
_KINDS: dict[str, type[Record]] = {"partial": Partial, "slab": SlabSent, "stats": TaskStats,
                                   "declined": Declined, "segment": Segment, "lost": Lost}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


@functools.lru_cache(maxsize=256)
def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


@functools.lru_cache(maxsize=256)
def _snake(name: str) -> str:
    # Cached: the driver loads one record per partial and per segment (tens of thousands),
    # and the regex per key was 4.5 CPU s of comparison 7's driver (bench.units).
    return _SNAKE.sub(r"_\1", name).lower()


_SNAKE = re.compile(r"(?<!^)([A-Z])")


#: Per record class: (field, JSON key) of each field, and the field names.
_KEYS = {cls: tuple((f.name, _camel(f.name)) for f in dataclasses.fields(cls))
         for cls in _KINDS.values()}
_NAMES = {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in _KINDS.values()}


class RecordError(ValueError):
    """A line that is not a record of this version."""


def dump(record: Record) -> str:
    """The record as one line of JSON."""
    body: dict[str, Any] = {"v": VERSION, "kind": _KIND_OF[type(record)]}
    for name, key in _KEYS[type(record)]:
        value = getattr(record, name)
        if value is not None:
            body[key] = list(value) if isinstance(value, tuple) else value
    return json.dumps(body, separators=(",", ":"))


def load(line: str) -> Record:
    """The record of a line written by :func:`dump`; RecordError for anything else."""
    try:
        body = json.loads(line)
        version, kind = body.pop("v"), body.pop("kind")
    except (ValueError, KeyError, AttributeError) as exc:
        raise RecordError(f"not a phase record: {line[:120]!r}") from exc
    if version != VERSION:
        raise RecordError(f"a phase record of version {version!r} (this release reads "
                          f"{VERSION}): run the driver and the executors from one release")
    cls = _KINDS.get(kind)
    if cls is None:
        raise RecordError(f"unknown phase record kind {kind!r}")
    names = _NAMES[cls]
    args: dict[str, Any] = {}
    for key, value in body.items():
        name = _snake(key)
        if name not in names:
            raise RecordError(f"{kind} record has an unknown field {key!r}")
        args[name] = tuple(value) if isinstance(value, list) else value
    return cls(**args)


__all__ = ["Declined", "Lost", "Partial", "PartitionId", "Record", "RecordError", "Segment",
           "SlabSent", "TaskStats", "VERSION", "dump", "load"]
