"""Wire-level vocabulary shared by server and client: ids, intervals, keys, headers, digests.

Nothing here does I/O; every parser raises a :mod:`shuffled.errors` domain error naming what
was wrong, so the server can answer 400 and the client can refuse before sending.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import StrEnum
from functools import lru_cache

from shuffled.errors import DigestMismatch, InvalidId, InvalidInterval, InvalidPartitionId

API_PREFIX = "/druid/worker/v1/shuffle"
# A lost daemon's share served by another from deep storage: <daemon>/peers/<instance> is
# a base URL under which the read routes answer (docs/deep-storage.md).
PEERS_PATH = "/peers/"
ARROW_STREAM = "application/vnd.apache.arrow.stream"

# RFC 9530: Content-Digest covers the message content, Repr-Digest the whole representation.
CONTENT_DIGEST = "Content-Digest"
REPR_DIGEST = "Repr-Digest"
# Extra facts about a stored partial segment, returned on per-partial GET/PUT.
ROWS_HEADER = "X-Shuffled-Rows"
GENERATION_HEADER = "X-Shuffled-Generation"
# Paged partition reads (Presto's X-Presto-Page-Token, -Page-End-Sequence-Id,
# -Buffer-Complete analogues) and task states.
PAGE_TOKEN_HEADER = "X-Shuffled-Page-Token"
NEXT_TOKEN_HEADER = "X-Shuffled-Page-Next-Token"
COMPLETE_HEADER = "X-Shuffled-Complete"
PENDING_BYTES_HEADER = "X-Shuffled-Pending-Bytes"
TASK_STATE_HEADER = "X-Shuffled-Task-State"


class TaskDataState(StrEnum):
    """A supervisor task's data on a daemon, as ``X-Shuffled-Task-State`` and ``GET
    .../state`` say it (not the overlord's view of the task: ``cleanup.policy.TaskState``).
    The values are the wire strings."""

    NONE = "none"  # nothing held
    RUNNING = "running"  # partials held, not sealed
    SEALED = "sealed"  # its committed subtasks are known: reads can complete
    FAILED = "failed"  # marked failed: reads of it never complete


class PartialStatus(StrEnum):
    """What became of one partial segment of a bulk upload (the ``status`` of its item in
    the answer; the values are the wire strings)."""

    CREATED = "created"  # stored, the first generation of its key
    REPLACED = "replaced"  # stored, a newer generation of a key already held
    REJECTED = "rejected"  # refused (digest, Arrow, size, space): nothing of it kept


MAX_ID_LENGTH = 255
_ID_RE = re.compile(r"[A-Za-z0-9_\-.:]{1,255}")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@lru_cache(maxsize=4096)
def _id_ok(value: str) -> bool:
    """Whether ``value`` is a valid id. Cached: a bulk upload or read names the same few
    subtask ids thousands of times (the regex was a visible share of each partial); at most
    about a MiB whatever the ids sent."""
    return (0 < len(value) <= MAX_ID_LENGTH and _ID_RE.fullmatch(value) is not None
            and not value.startswith("."))


def validate_id(value: str, name: str = "id") -> str:
    """Return ``value`` if it is a valid supervisorTaskId/subTaskId, else raise InvalidId.

    Valid: 1-255 of letters, digits, ``_ - . :``, not starting with ``.`` (so never ``.``,
    ``..`` or a hidden file name). Path separators, NUL and percent signs are refused, which
    also refuses any percent-encoded traversal that survived URL decoding.
    """
    if type(value) is str and _id_ok(value):  # noqa: E721 - a str subclass takes the long way
        return value
    if not isinstance(value, str) or not value:
        raise InvalidId(f"{name} is empty", field=name)
    if len(value) > MAX_ID_LENGTH:
        raise InvalidId(f"{name} is longer than {MAX_ID_LENGTH} characters", field=name)
    if not _ID_RE.fullmatch(value):
        raise InvalidId(
            f"{name} {value[:64]!r} has characters outside letters, digits and _ - . :",
            field=name,
        )
    if value.startswith("."):
        raise InvalidId(f"{name} {value[:64]!r} starts with '.'", field=name)
    return value


def parse_instant(text: str, name: str = "instant") -> int:
    """Parse an ISO-8601 instant to UTC epoch milliseconds.

    Accepts ``2018-01-01``, ``2018-01-01T00:00``, ``...:00.123Z`` and explicit offsets;
    a value without an offset is taken as UTC (Druid's rule).
    """
    if type(text) is str:  # noqa: E721 - hashable for the cache; anything else is refused
        return _parse_instant(text, name)
    return _parse_instant_uncached(text, name)


@lru_cache(maxsize=4096)
def _parse_instant(text: str, name: str) -> int:
    """Cached: a bulk read names the same few thousand interval bounds over and over
    (datetime parsing was ~10% of serving a small partial). Refusals are not cached."""
    return _parse_instant_uncached(text, name)


def _parse_instant_uncached(text: str, name: str) -> int:
    if not text or not isinstance(text, str):
        raise InvalidInterval(f"{name} is missing", field=name)
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidInterval(f"{name} {text[:64]!r} is not an ISO-8601 instant", field=name)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    delta = parsed - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


@lru_cache(maxsize=4096)
def format_instant(millis: int) -> str:
    """Canonical form: UTC with milliseconds, e.g. ``2018-01-01T00:00:00.000Z``.

    Cached: a bulk upload or read names the same few thousand interval bounds over and
    over (it was ~6% of phase 1's time on the Druid-shaped bench)."""
    seconds, ms = divmod(millis, 1000)
    dt = datetime.fromtimestamp(seconds, tz=timezone.utc)
    # Explicit widths: strftime's %Y does not zero-pad years before 1000 on glibc.
    return (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:"
            f"{dt.second:02d}.{ms:03d}Z")


@dataclass(frozen=True, order=True, slots=True)
class Interval:
    """A half-open time interval [start, end) in UTC epoch milliseconds."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start >= self.end:
            raise InvalidInterval(
                f"interval start {format_instant(self.start)} is not before end "
                f"{format_instant(self.end)}",
                field="start",
            )

    @classmethod
    def parse(cls, start: str | None, end: str | None) -> Interval:
        bounds = parse_instant(start or "", "start"), parse_instant(end or "", "end")
        return interval_of(*bounds) if cls is Interval else cls(*bounds)

    @classmethod
    def parse_druid(cls, text: str) -> Interval:
        """Parse Druid's ``start/end`` interval notation."""
        if not isinstance(text, str) or text.count("/") != 1:
            raise InvalidInterval(f"interval {str(text)[:64]!r} is not 'start/end'", field="interval")
        start, end = text.split("/")
        return cls.parse(start, end)

    @property
    def start_iso(self) -> str:
        return format_instant(self.start)

    @property
    def end_iso(self) -> str:
        return format_instant(self.end)

    @property
    def dirname(self) -> str:
        """The interval as one path component (Druid's ``start_end``)."""
        return f"{self.start_iso}_{self.end_iso}"

    def __str__(self) -> str:
        return f"{self.start_iso}/{self.end_iso}"


@lru_cache(maxsize=4096)
def interval_of(start: int, end: int) -> Interval:
    """``Interval(start, end)``, one shared object per bounds: frames and catalog rows name
    the same few intervals thousands of times (an Interval is immutable)."""
    return Interval(start, end)


# Druid's partitionNum is a Java int: the largest partitionId any writer can produce.
MAX_PARTITION_ID = 2**31 - 1


def parse_partition_id(value: str | int | None) -> int:
    """Parse a partitionId: a decimal integer from 0 to 2147483647 (no sign, no spaces)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif value is None or value == "":
        raise InvalidPartitionId("partitionId is missing", field="partitionId")
    elif not isinstance(value, str) or not value.isdecimal() or not value.isascii():
        raise InvalidPartitionId(
            f"partitionId {str(value)[:32]!r} is not an integer >= 0", field="partitionId"
        )
    else:
        number = int(value[:12]) if len(value) <= 12 else MAX_PARTITION_ID + 1
    if not 0 <= number <= MAX_PARTITION_ID:
        raise InvalidPartitionId(
            f"partitionId {str(value)[:32]} is outside 0..{MAX_PARTITION_ID}",
            field="partitionId",
        )
    return number


@dataclass(frozen=True, order=True, slots=True)
class PartitionKey:
    """One shuffle partition of a supervisor task: (interval, partitionId)."""

    supervisor_task_id: str
    interval: Interval
    partition_id: int

    def __post_init__(self) -> None:
        validate_id(self.supervisor_task_id, "supervisorTaskId")
        parse_partition_id(self.partition_id)

    def query(self) -> dict[str, str]:
        return {
            "start": self.interval.start_iso,
            "end": self.interval.end_iso,
            "partitionId": str(self.partition_id),
        }

    def path(self) -> str:
        return f"{API_PREFIX}/tasks/{self.supervisor_task_id}/partition"


@dataclass(frozen=True, order=True, slots=True)
class PartialKey:
    """One partial segment: what one subtask wrote for one partition."""

    supervisor_task_id: str
    sub_task_id: str
    interval: Interval
    partition_id: int

    def __post_init__(self) -> None:
        validate_id(self.supervisor_task_id, "supervisorTaskId")
        validate_id(self.sub_task_id, "subTaskId")
        parse_partition_id(self.partition_id)

    @property
    def partition(self) -> PartitionKey:
        return PartitionKey(self.supervisor_task_id, self.interval, self.partition_id)

    def query(self) -> dict[str, str]:
        return self.partition.query()

    def path(self) -> str:
        return f"{API_PREFIX}/tasks/{self.supervisor_task_id}/{self.sub_task_id}/partition"

    def __str__(self) -> str:
        return (
            f"{self.supervisor_task_id}/{self.sub_task_id} {self.interval} "
            f"partition {self.partition_id}"
        )


def task_path(supervisor_task_id: str | None = None) -> str:
    if supervisor_task_id is None:
        return f"{API_PREFIX}/tasks"
    return f"{API_PREFIX}/tasks/{validate_id(supervisor_task_id, 'supervisorTaskId')}"


# --- RFC 9530 digests -------------------------------------------------------------------

def format_crc32c(crc: int) -> str:
    """``crc32c=:<base64 of the 4 big-endian bytes>:`` (RFC 9530 section 4, RFC 8941 bytes)."""
    return "crc32c=:" + base64.b64encode(crc.to_bytes(4, "big")).decode("ascii") + ":"


def parse_crc32c(header: str | None) -> int | None:
    """The crc32c value in a Content-Digest/Repr-Digest header, or None if it names none.

    The header is an RFC 8941 dictionary; other algorithms (e.g. ``sha-256``) are ignored.
    A malformed crc32c member raises DigestMismatch (400), never passes silently.
    """
    if not header:
        return None
    for member in header.split(","):
        name, sep, value = member.strip().partition("=")
        if name.strip().lower() != "crc32c":
            continue
        value = value.strip()
        if not sep or len(value) < 2 or value[0] != ":" or value[-1] != ":":
            raise DigestMismatch(f"malformed crc32c digest {value[:32]!r}", field="Content-Digest")
        try:
            raw = base64.b64decode(value[1:-1], validate=True)
        except ValueError:
            raise DigestMismatch(f"malformed crc32c digest {value[:32]!r}", field="Content-Digest")
        if len(raw) != 4:
            raise DigestMismatch("crc32c digest is not 4 bytes", field="Content-Digest")
        return int.from_bytes(raw, "big")
    return None


def crc_hex(crc: int) -> str:
    return f"{crc:08x}"
