"""Bulk format 2: a flush of partial segments as one schema message and addressed bodies.

Format 1 (:mod:`shuffled.framing`) carries each partial as a whole Arrow IPC stream with a
JSON header: per partial, a schema message and an end-of-stream marker the daemon must
parse and a JSON object it must decode. A phase-1 flush is one schema and thousands of
small bodies, so format 2 sends the schema once and each partial as its body alone (its
dictionary and record batch messages: a byte range of the flush's one IPC stream) under a
fixed binary header; the daemon stores exactly that (storage format 3). Drill's data tunnel
in HTTP: addressed batches, and an END frame as the last-batch flag. Each frame
(little-endian)::

    0   4  magic b"SHB2"
    4   1  kind: 1 SCHEMA, 2 PARTIAL, 3 END
    5   3  reserved, zero
    8   4  header_len
    12  8  body_len
    20  4  CRC32C of bytes [0, 20) and the header
    24  h  header, by kind:
           SCHEMA   u32 schema id
           PARTIAL  u32 schema id (0xFFFFFFFF: the body is a whole stream), i64 start
                    ms, i64 end ms, u32 partitionId, u32 CRC32C of the body, then the
                    subTaskId (UTF-8, the rest of the header)
           END      u32 count of PARTIAL frames before it
    24+h b body: SCHEMA, one schema message; PARTIAL, the partial's body; END, none

A PARTIAL refers to a SCHEMA sent earlier in the same request. The partial it stands for is
the stream ``schema message + body + end-of-stream marker``: its length and CRC32C are what
the answer and every read give. Pure functions, no I/O: the server and the client share
them; docs/bulk-upload.md has the contract.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from shuffled.crc import crc32c
from shuffled.errors import BadRequest
from shuffled.framing import FIXED, FIXED_LEN, MAX_HEADER, FramingError
from shuffled.protocol import PartialKey, interval_of, parse_partition_id, validate_id

MAGIC = b"SHB2"
SCHEMA, PARTIAL, END = 1, 2, 3
KINDS = {SCHEMA: "SCHEMA", PARTIAL: "PARTIAL", END: "END"}
_ID = struct.Struct("<I")
_PARTIAL = struct.Struct("<IqqII")
MAX_SCHEMA = 1 << 20  # bytes of one schema message
#: A PARTIAL frame's schema id when its body is a whole stream (sent as it is: what does
#: not split into a schema message and a body, which the daemon then refuses for itself).
WHOLE = 0xFFFFFFFF


class Frame(NamedTuple):
    """A frame's fixed part, checked; its header bytes follow (``header_len`` of them). A
    tuple: one is built per partial received, and a frozen dataclass cost several times
    more."""

    kind: int
    header_len: int
    body_len: int
    crc: int
    fixed: bytes


def _head(kind: int, header: bytes, body_len: int) -> bytes:
    fixed = FIXED.pack(MAGIC, kind, b"\0\0\0", len(header), body_len)
    return fixed + crc32c(header, crc32c(fixed)).to_bytes(4, "little") + header


def encode_schema(schema_id: int, schema_len: int) -> bytes:
    """The head of a SCHEMA frame (its body, the schema message, follows)."""
    return _head(SCHEMA, _ID.pack(schema_id), schema_len)


def encode_partial(key: PartialKey, schema_id: int, body_len: int, body_crc: int) -> bytes:
    """The head of a PARTIAL frame (its body follows)."""
    header = _PARTIAL.pack(schema_id, key.interval.start, key.interval.end, key.partition_id,
                           body_crc) + key.sub_task_id.encode()
    return _head(PARTIAL, header, body_len)


def encode_end(count: int) -> bytes:
    return _head(END, _ID.pack(count), 0)


def parse_fixed(raw: bytes) -> Frame:
    """Check a frame's first :data:`FIXED_LEN` bytes; FramingError naming what is wrong."""
    magic, kind, reserved, header_len, body_len = FIXED.unpack_from(raw)
    if magic != MAGIC:
        raise FramingError(f"frame does not start with {MAGIC!r} (got {magic!r}): a request "
                           f"keeps one bulk format throughout", field="body")
    if kind not in KINDS or reserved != b"\0\0\0":
        raise FramingError(f"frame has unknown kind {kind} or non-zero reserved bytes",
                           field="body")
    if not 1 <= header_len <= MAX_HEADER:
        raise FramingError(f"frame header length {header_len} is not 1..{MAX_HEADER}",
                           field="body")
    if kind == END and body_len:
        raise FramingError("the END frame carries a body", field="body")
    if kind == SCHEMA and not 0 < body_len <= MAX_SCHEMA:
        raise FramingError(f"a schema message of {body_len} bytes (1..{MAX_SCHEMA})",
                           field="body")
    return Frame(kind, header_len, body_len, int.from_bytes(raw[FIXED.size:FIXED_LEN], "little"),
                 bytes(raw[: FIXED.size]))


def check_header(frame: Frame, header: bytes) -> None:
    if crc32c(header, crc32c(frame.fixed)) != frame.crc:
        raise FramingError("frame header fails its CRC32C: the body is corrupt or not "
                           "framed as docs/bulk-upload.md says", field="body")


def number(frame: Frame, header: bytes) -> int:
    """The u32 of a SCHEMA (its id) or END (its count) header."""
    if len(header) != _ID.size:
        raise FramingError(f"{KINDS[frame.kind]} frame header has {len(header)} bytes, not 4",
                           field="body")
    return int(_ID.unpack(header)[0])


def partial_of(supervisor_task_id: str, header: bytes) -> tuple[PartialKey, int, int]:
    """The key, schema id and body CRC32C of a PARTIAL frame's header."""
    if len(header) <= _PARTIAL.size:
        raise FramingError("PARTIAL frame header is too short to hold a subTaskId",
                           field="body")
    schema_id, start, end, pid, crc = _PARTIAL.unpack_from(header)
    try:
        sub = validate_id(header[_PARTIAL.size:].decode("utf-8"), "subTaskId")
        key = PartialKey(supervisor_task_id, sub, interval_of(start, end), parse_partition_id(pid))
    except UnicodeDecodeError as exc:
        raise FramingError("frame header: subTaskId is not UTF-8", field="subTaskId") from exc
    except BadRequest as exc:
        raise FramingError(f"frame header: {exc.message}", **exc.details) from exc
    return key, schema_id, crc
