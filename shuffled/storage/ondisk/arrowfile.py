"""Checks that a file is one complete Arrow IPC stream, and finds its parts.

Run on an upload's bytes before they become visible. A large one it reads through a memory map (no copy of
the data into the heap), validates every record batch's structure, requires the
end-of-stream marker and nothing after it, so a truncated or padded body is refused.
The checksums are read with pread into one small buffer, not through the map: touching
every page of the map would make the file resident in the daemon (RSS growing with the
size of the partial segments being uploaded).
"""

from __future__ import annotations

import functools
import itertools
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from shuffled.crc import combine, crc32c
from shuffled.errors import InvalidBody
from shuffled.storage.ondisk import ipcshape

CONTINUATION = ipcshape.CONTINUATION
EOS = CONTINUATION + b"\x00\x00\x00\x00"  # Arrow IPC end-of-stream marker (format >= 1.0)
EOS_CRC = crc32c(EOS)


class ArrowFacts(NamedTuple):
    """What the store keeps about a stream to serve it without decoding it again (a tuple:
    one is built per partial received)."""

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


_CRC_CHUNK = 1 << 20
DROP_STEP = 2 << 20  # validated bytes dropped from the mapping at a time


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


def _validate(buf: pa.Buffer, done_to: Callable[[int], None] | None = None,
              ) -> tuple[int, int, int, bool]:
    """Check that ``buf`` is exactly one complete Arrow IPC stream: (rows, batches,
    schema_len, has_dictionaries), or InvalidBody. ``done_to(n)``, if given, is told after
    each batch that bytes before ``n`` will not be read again."""
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
        walker = ipcshape.Walker(memoryview(buf), schema_len, size - len(EOS), schema)
        while True:
            walker.next_batch()  # what the batch declares, before pyarrow believes it
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            batch.validate()
            rows += batch.num_rows
            batches += 1
            del batch
            if done_to is not None:
                done_to(source.tell())
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
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    # A pack just written sits in the page cache as large folios, and a fault maps the
    # whole folio: validating a large partial (its metadata, every few MiB) mapped tens of
    # MiB of them for a few ms, the daemon's peak RSS though none of it was its own. What was validated is dropped from the mapping as it goes (the page cache keeps
    # it), so about DROP_STEP and a batch are mapped at once.
    dropped = offset - offset % mmap.PAGESIZE

    def drop(upto: int) -> None:
        nonlocal dropped
        end = offset + upto - (offset + upto) % mmap.PAGESIZE
        if end - dropped >= DROP_STEP:
            mapped.madvise(mmap.MADV_DONTNEED, dropped, end - dropped)
            dropped = end
    view = memoryview(mapped)[offset: offset + size]
    try:
        rows, batches, schema_len, dicts = _validate(pa.py_buffer(view), drop)
    finally:
        try:
            view.release()
            mapped.close()
        except BufferError:
            pass  # an error's traceback still holds a buffer: unmapped when it is freed
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


# -- many partials of one schema at once (bulk format 2, and gathered small uploads) ---------


@dataclass(frozen=True, slots=True)
class SchemaMessage:
    """One Arrow IPC schema message: what partials sent as bodies refer to."""

    data: bytes
    crc: int
    has_dictionaries: bool
    shape: ipcshape.Shape  # what its batches must carry (:class:`.ipcshape.Walker`)

    @classmethod
    def parse(cls, data: bytes) -> SchemaMessage:
        """``data`` if it is exactly one schema message, else InvalidBody. A task sends
        every partial with the same schema: the answer for a message seen lately is
        remembered (:func:`_parsed`), so a single PUT does not read it with Arrow again
        (6% of the event loop's time in single durable PUTs)."""
        if len(data) <= SCHEMA_MEMO_BYTES:
            return _parsed(bytes(data))
        return cls._read(data)

    @classmethod
    def _read(cls, data: bytes) -> SchemaMessage:
        if len(data) < 8 or data[:4] != CONTINUATION:
            raise InvalidBody("schema frame is not an Arrow IPC message")
        (meta_len,) = struct.unpack("<i", data[4:8])
        if meta_len <= 0 or 8 + meta_len != len(data):
            raise InvalidBody(f"schema frame of {len(data)} bytes holds a message of "
                              f"{8 + meta_len}: send exactly one schema message")
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(data))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as exc:
            raise InvalidBody(f"schema frame is not an Arrow schema message: {exc}") from exc
        return cls(bytes(data), crc32c(data), schema_has_dictionaries(schema),
                   ipcshape.Shape.of(schema))

    def stream_crc(self, body_crc: int, body_len: int) -> int:
        """CRC32C of the stream ``schema message + body + end-of-stream marker``."""
        return combine(combine(self.crc, body_crc, body_len), EOS_CRC, len(EOS))

    def facts(self, rows: int, batches: int, body_crc: int) -> ArrowFacts:
        return ArrowFacts(rows, batches, len(self.data), self.crc, body_crc,
                          self.has_dictionaries)


#: Schema messages up to this size are remembered once read (:func:`_parsed`), the last
#: :data:`SCHEMA_MEMO` of them: at most 4 MiB held, whatever the clients send.
SCHEMA_MEMO_BYTES = 64 << 10
SCHEMA_MEMO = 64


@functools.lru_cache(maxsize=SCHEMA_MEMO)
def _parsed(data: bytes) -> SchemaMessage:
    # A refusal raises, and lru_cache keeps no exception: a bad message is read each time.
    return SchemaMessage._read(data)


def split_stream(data: memoryview) -> tuple[bytes, memoryview]:
    """A whole stream held in memory as (schema message, body): cheap checks only (the
    body is validated by :func:`validate_bodies`); InvalidBody if it has no schema message
    in front or no end-of-stream marker at the end."""
    size = len(data)
    if size < 16 or bytes(data[:4]) != CONTINUATION:
        raise InvalidBody(f"body of {size} bytes is not an Arrow IPC stream (no "
                          f"continuation marker; pre-1.0 legacy streams are not accepted)")
    (meta_len,) = struct.unpack("<i", data[4:8])
    schema_len = 8 + meta_len
    if meta_len <= 0 or schema_len > size - len(EOS):
        raise InvalidBody("body does not start with an Arrow schema message")
    if bytes(data[size - len(EOS):]) != EOS:
        raise InvalidBody("Arrow stream has no end-of-stream marker: the body is truncated "
                          "or the writer was not closed")
    return bytes(data[:schema_len]), data[schema_len: size - len(EOS)]


def validate_bodies(schema: SchemaMessage, bodies: Sequence[memoryview],
                    ) -> list[tuple[int, int] | InvalidBody]:
    """Check that each body, after ``schema``, is a valid stream body (dictionary and record
    batch messages, nothing else): per body its (rows, batches) or the InvalidBody refusing
    it. All bodies are read as ONE stream with one reader (about 6 us a partial, against
    ~70 us for a reader per partial), each required to end on a message boundary; on any
    doubt (a fault, dictionaries, which a joined stream would read as replacements) each
    is read alone, so a bad one is refused by itself and the others are kept."""
    if not bodies:
        return []
    if not schema.has_dictionaries:
        joined = b"".join([schema.data, *bodies, EOS])
        ends = list(itertools.accumulate((len(b) for b in bodies), initial=len(schema.data)))[1:]
        source = pa.BufferReader(pa.py_buffer(joined))
        out: list[tuple[int, int] | InvalidBody] = []
        rows = batches = 0
        try:
            reader = pa.ipc.open_stream(source)
            ipcshape.Walker(memoryview(joined), len(schema.data), len(joined) - len(EOS),
                            reader.schema, schema.shape).all()
            while len(out) < len(bodies):
                at = ends[len(out)]
                if source.tell() == at:  # a body without record batches
                    out.append((rows, batches))
                    rows = batches = 0
                    continue
                batch = reader.read_next_batch()
                batch.validate()
                rows += batch.num_rows
                batches += 1
                if source.tell() > at:
                    break  # a batch straddles two bodies: read them alone
            else:
                if source.tell() == len(joined) - len(EOS):
                    return out
        except (StopIteration, InvalidBody, pa.ArrowInvalid, pa.ArrowTypeError,
                pa.ArrowNotImplementedError, OSError):
            pass  # read alone, each body is refused or kept by itself
    return [_alone(schema, body) for body in bodies]


def _alone(schema: SchemaMessage, body: memoryview) -> tuple[int, int] | InvalidBody:
    try:
        rows, batches, _, _ = _validate(pa.py_buffer(b"".join([schema.data, body, EOS])))
    except InvalidBody as exc:
        return exc
    return rows, batches
