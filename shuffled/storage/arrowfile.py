"""Checks that a file is one complete Arrow IPC stream, and finds its parts.

Run on an upload's bytes before they become visible. A large one it reads through a memory map (no copy of
the data into the heap), validates every record batch's structure, requires the
end-of-stream marker and nothing after it, so a truncated or padded body is refused.
The checksums are read with pread into one small buffer, not through the map: touching
every page of the map would make the file resident in the daemon (RSS growing with the
size of the partial segments being uploaded).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import pyarrow as pa

from shuffled.crc import crc32c
from shuffled.errors import InvalidBody

CONTINUATION = b"\xff\xff\xff\xff"
EOS = CONTINUATION + b"\x00\x00\x00\x00"  # Arrow IPC end-of-stream marker (format >= 1.0)
EOS_CRC = crc32c(EOS)


@dataclass(frozen=True, slots=True)
class ArrowFacts:
    """What the store keeps about a stream to serve it without decoding it again."""

    rows: int
    batches: int
    schema_len: int  # bytes of the leading schema message
    schema_crc: int  # CRC32C of those bytes: the aggregate fast path compares it
    body_crc: int  # CRC32C of [schema_len, size - len(EOS)): record/dictionary batches
    has_dictionaries: bool


def _has_dictionary(typ: pa.DataType) -> bool:
    if pa.types.is_dictionary(typ):
        return True
    return any(_has_dictionary(typ.field(i).type) for i in range(typ.num_fields))


def schema_has_dictionaries(schema: pa.Schema) -> bool:
    return any(_has_dictionary(f.type) for f in schema)


def _view(source: pa.MemoryMappedFile, offset: int, length: int) -> pa.Buffer:
    """Bytes [offset, offset+length) of a memory map, zero-copy."""
    source.seek(offset)
    return source.read_buffer(length)


_CRC_CHUNK = 1 << 20


def _crc_range(path: str, offset: int, length: int) -> int:
    """CRC32C of bytes [offset, offset+length) of ``path``, read in bounded chunks."""
    crc = 0
    buf = bytearray(min(_CRC_CHUNK, max(length, 1)))
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        while length > 0:
            got = os.preadv(fd, [view[: min(len(buf), length)]], offset)
            if got <= 0:
                raise InvalidBody("file ended while computing its checksum")
            crc = crc32c(view[:got], crc)
            offset += got
            length -= got
    finally:
        os.close(fd)
    return crc


def _validate(buf: pa.Buffer) -> tuple[int, int, int, bool]:
    """Check that ``buf`` is exactly one complete Arrow IPC stream: (rows, batches,
    schema_len, has_dictionaries), or InvalidBody."""
    size = buf.size
    if size < 16:
        raise InvalidBody(f"body of {size} bytes is not an Arrow IPC stream")
    head = buf[:8].to_pybytes()
    if head[:4] != CONTINUATION:
        raise InvalidBody(
            "body is not an Arrow IPC stream (no continuation marker; pre-1.0 "
            "legacy streams are not accepted)"
        )
    (meta_len,) = struct.unpack("<i", head[4:8])
    schema_len = 8 + meta_len
    if meta_len <= 0 or schema_len > size - len(EOS):
        raise InvalidBody("body does not start with an Arrow schema message")
    if buf[size - len(EOS):].to_pybytes() != EOS:
        raise InvalidBody(
            "Arrow stream has no end-of-stream marker: the body is truncated or "
            "the writer was not closed"
        )
    rows = batches = 0
    source = pa.BufferReader(buf)
    try:
        reader = pa.ipc.open_stream(source)
        schema = reader.schema
        for batch in reader:
            batch.validate()
            rows += batch.num_rows
            batches += 1
        end = source.tell()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as exc:
        raise InvalidBody(f"body is not a valid Arrow IPC stream: {exc}") from exc
    if end != size:
        raise InvalidBody(f"Arrow stream ends at byte {end} but the body has {size} bytes")
    return rows, batches, schema_len, schema_has_dictionaries(schema)


def inspect(path: str, size: int, body_crc: int | None = None, offset: int = 0) -> ArrowFacts:
    """Validate the stream at bytes ``[offset, offset + size)`` of ``path`` and return its
    facts, or InvalidBody.

    ``body_crc``, when the writer computed it while streaming, saves reading the file again.
    """
    if size < 16:
        raise InvalidBody(f"body of {size} bytes is not an Arrow IPC stream")
    with pa.memory_map(path, "r") as source:
        rows, batches, schema_len, dicts = _validate(_view(source, offset, size))
    return ArrowFacts(
        rows=rows,
        batches=batches,
        schema_len=schema_len,
        schema_crc=_crc_range(path, offset, schema_len),
        body_crc=(_crc_range(path, offset + schema_len, size - len(EOS) - schema_len)
                  if body_crc is None else body_crc),
        has_dictionaries=dicts,
    )


def inspect_bytes(data: bytes | bytearray | memoryview) -> ArrowFacts:
    """Like :func:`inspect` for a stream held in memory (a small partial segment)."""
    view = memoryview(data)
    rows, batches, schema_len, dicts = _validate(pa.py_buffer(view))
    return ArrowFacts(
        rows=rows, batches=batches, schema_len=schema_len,
        schema_crc=crc32c(view[:schema_len]),
        body_crc=crc32c(view[schema_len: len(view) - len(EOS)]),
        has_dictionaries=dicts,
    )
