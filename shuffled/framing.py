"""The bulk upload's framing: many addressed partial segments in one request body.

Drill's data tunnel sends addressed batches with a last-batch flag; this is that, over one
HTTP request (docs/bulk-upload.md has the whole contract). Each frame (little-endian)::

    0   4  magic b"SHB1" (the 1 is the format version)
    4   1  flags: bit 0 END (end of batch); others zero
    5   3  reserved, zero
    8   4  header_len (1..65536)
    12  8  body_len (0 for END)
    20  4  CRC32C of bytes [0, 20) and the header
    24  h  header: UTF-8 JSON object
    24+h b body: one Arrow IPC stream, byte for byte what a single PUT carries

A data frame's header is ``{"subTaskId", "start", "end", "partitionId", "crc32c"}`` (the
supervisor task is the request's); the END frame's is ``{"count": N}``, the number of data
frames before it. Pure functions, no I/O: the server and the client share them.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any

from shuffled.crc import crc32c
from shuffled.errors import BadRequest
from shuffled.protocol import (
    Interval, PartialKey, PartitionKey, crc_hex, parse_partition_id, validate_id,
)

MEDIA_TYPE = "application/vnd.shuffled.partials"
MAGIC = b"SHB1"
FLAG_END = 0x01
FIXED = struct.Struct("<4sB3sIQ")  # the 20 bytes the header CRC covers with the header
FIXED_LEN = FIXED.size + 4
MAX_HEADER = 1 << 16
_HEX8 = re.compile(r"[0-9a-fA-F]{8}")  # int(x, 16) alone would take "0x1234ab", "+1234567"


class FramingError(BadRequest):
    """The bulk body is not a well-formed sequence of frames: the batch stops there."""

    code = "bad_framing"


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame's fixed part, checked; its header bytes follow (``header_len`` of them)."""

    end: bool
    header_len: int
    body_len: int
    crc: int
    fixed: bytes


# json.dumps with separators builds an encoder per call; one shared encoder writes the
# same bytes (a frame header per partial sent, per partition served).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _header(fixed: bytes, header: bytes) -> bytes:
    """The whole frame head: fixed part, its CRC32C (over fixed part + header), header."""
    return fixed + crc32c(header, crc32c(fixed)).to_bytes(4, "little") + header


def encode(key: PartialKey, body_len: int, body_crc: int) -> bytes:
    """The fixed part and header of a data frame (its body follows)."""
    header = _COMPACT.encode({
        "subTaskId": key.sub_task_id, "start": key.interval.start_iso,
        "end": key.interval.end_iso, "partitionId": key.partition_id,
        "crc32c": crc_hex(body_crc),
    }).encode()
    return _header(FIXED.pack(MAGIC, 0, b"\0\0\0", len(header), body_len), header)


def encode_end(count: int) -> bytes:
    """The END frame closing a batch of ``count`` data frames."""
    header = _COMPACT.encode({"count": count}).encode()
    return _header(FIXED.pack(MAGIC, FLAG_END, b"\0\0\0", len(header), 0), header)


def parse_fixed(raw: bytes) -> Frame:
    """Check a frame's first :data:`FIXED_LEN` bytes; FramingError naming what is wrong."""
    magic, flags, reserved, header_len, body_len = FIXED.unpack(raw[: FIXED.size])
    if magic != MAGIC:
        version = magic[3:4].decode("latin-1") if magic[:3] == MAGIC[:3] else None
        raise FramingError(
            f"frame does not start with {MAGIC!r}"
            + (f": bulk format version {version!r} is not supported (this daemon reads 1 and 2)"
               if version else f" (got {magic!r})"), field="body")
    if flags & ~FLAG_END or reserved != b"\0\0\0":
        raise FramingError(f"frame has unknown flags {flags:#x} or non-zero reserved bytes",
                           field="body")
    if not 1 <= header_len <= MAX_HEADER:
        raise FramingError(f"frame header length {header_len} is not 1..{MAX_HEADER}",
                           field="body")
    end = bool(flags & FLAG_END)
    if end and body_len:
        raise FramingError("the END frame carries a body", field="body")
    return Frame(end, header_len, body_len, int.from_bytes(raw[FIXED.size:FIXED_LEN], "little"),
                 raw[: FIXED.size])


def parse_header(frame: Frame, header: bytes) -> dict[str, Any]:
    """The frame's JSON header once its CRC32C checks out."""
    if crc32c(header, crc32c(frame.fixed)) != frame.crc:
        raise FramingError("frame header fails its CRC32C: the body is corrupt or not "
                           "framed as docs/bulk-upload.md says", field="body")
    try:
        # Decoded first: json.loads would also take UTF-16/32 bytes, the format says UTF-8.
        value = json.loads(header.decode("utf-8"))
    except ValueError as exc:
        raise FramingError(f"frame header is not JSON: {exc}", field="body") from exc
    if not isinstance(value, dict):
        raise FramingError("frame header is not a JSON object", field="body")
    return value


def data_key(supervisor_task_id: str, header: dict[str, Any]) -> tuple[PartialKey, int | None]:
    """The partial's key and declared CRC32C from a data frame's header."""
    try:
        sub = validate_id(header.get("subTaskId"), "subTaskId")  # type: ignore[arg-type]
        interval = Interval.parse(header.get("start"), header.get("end"))
        pid = header.get("partitionId")
        if not isinstance(pid, int) or isinstance(pid, bool):  # a JSON integer, not "3"
            raise BadRequest(f"partitionId {str(pid)[:32]!r} is not a JSON integer >= 0",
                             field="partitionId")
        pid = parse_partition_id(pid)
    except BadRequest as exc:
        raise FramingError(f"frame header: {exc.message}", **exc.details) from exc
    crc = header.get("crc32c")
    if crc is None:
        return PartialKey(supervisor_task_id, sub, interval, pid), None
    if not isinstance(crc, str) or not _HEX8.fullmatch(crc):
        raise FramingError(f"frame header crc32c {str(crc)[:16]!r} is not 8 hex digits",
                           field="crc32c")
    return PartialKey(supervisor_task_id, sub, interval, pid), int(crc, 16)


def end_count(header: dict[str, Any]) -> int:
    """The number of data frames an END frame's header declares."""
    count = header.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise FramingError("END frame header has no count", field="body")
    return count


# -- the bulk partition read's answer (docs/bulk-upload.md, "Reading many partitions") ------

PARTITIONS_MEDIA_TYPE = "application/vnd.shuffled.partitions"


def encode_partition(key: PartitionKey, body_len: int, body_crc: int, partials: int,
                     rows: int, fallback: str | None = None) -> bytes:
    """The fixed part and header of one partition's frame in a bulk read's answer; its
    body (``body_len`` bytes) is the partition's aggregate Arrow IPC stream. ``fallback``
    says why the body is empty and the partition must be read with the single GET."""
    interval = key.interval
    if fallback is None:
        # The JSON the encoder would write, formatted directly (one frame per partition
        # served): every value is an int or an ISO instant / hex digest, none needs escaping.
        header = (f'{{"start":"{interval.start_iso}","end":"{interval.end_iso}",'
                  f'"partitionId":{int(key.partition_id)},"partials":{int(partials)},'
                  f'"rows":{int(rows)},"crc32c":"{crc_hex(body_crc)}"}}').encode()
    else:
        header = _COMPACT.encode({
            "start": interval.start_iso, "end": interval.end_iso,
            "partitionId": key.partition_id, "partials": partials, "rows": rows,
            "crc32c": crc_hex(body_crc), "fallback": fallback,
        }).encode()
    return _header(FIXED.pack(MAGIC, 0, b"\0\0\0", len(header), body_len), header)


def partition_of(supervisor_task_id: str, header: dict[str, Any]) -> tuple[PartitionKey, int]:
    """The partition and body CRC32C a bulk read's frame header names."""
    try:
        interval = Interval.parse(header.get("start"), header.get("end"))
        pid = parse_partition_id(header.get("partitionId"))
        crc = header.get("crc32c")
        if not isinstance(crc, str) or not _HEX8.fullmatch(crc):
            raise FramingError(f"frame header crc32c {str(crc)[:16]!r} is not 8 hex digits")
    except BadRequest as exc:
        raise FramingError(f"frame header: {exc.message}", **exc.details) from exc
    return PartitionKey(supervisor_task_id, interval, pid), int(crc, 16)
