"""The Thrift compact protocol, as far as a Parquet footer and page header need it: the
writer's pieces (varints, field headers, lists) and a reader of whole structs.

Parquet's metadata is Thrift structs in the compact protocol
(https://github.com/apache/thrift/blob/master/doc/specs/thrift-compact-protocol.md). A
struct is its fields in order, each a header byte (the field id's delta from the previous
field's in the high nibble, the type in the low one; a delta over 15 is a zero nibble and
the id as a zigzag varint), then the value; a zero byte ends it. Integers are zigzag
varints, binaries a varint length then the bytes, a bool field's value is its type
(1 true, 2 false). The reader is for tests and for reading pyarrow's own footer once per
schema (:mod:`.plain`); the writer's pieces are what each segment file costs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# Compact protocol types (the low nibble of a field header, or a list's element type).
TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)
STOP = b"\x00"


class ThriftError(ValueError):
    """Bytes that are not a compact-protocol struct (truncated, or of an unknown type)."""


def uvarint(n: int) -> bytes:
    """``n`` (not negative) as an unsigned LEB128 varint."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> bytes:
    """A signed i16/i32/i64 as the compact protocol writes it: zigzag, then a varint."""
    if 0 <= n < _SMALL_COUNT:
        return _SMALL[n]
    return uvarint((n << 1) ^ (n >> 63))


# The small counts, sizes and offsets a footer is mostly made of, made once (~1 MB): a
# varint made in Python was a third of a small file's encoding.
_SMALL_COUNT = 1 << 15
_SMALL = tuple(uvarint(n << 1) for n in range(_SMALL_COUNT))


def list_header(size: int, kind: int) -> bytes:
    """A list's header: its size and its elements' type."""
    if size < 15:
        return bytes(((size << 4) | kind,))
    return bytes((0xF0 | kind,)) + uvarint(size)


def binary(value: bytes) -> bytes:
    return uvarint(len(value)) + value


@dataclass(frozen=True)
class Field:
    """A field as read: its id, its compact type, its value (a list of :class:`Field` for
    a struct, a list for a list or set), and where it lay in the bytes read: ``start`` is
    its header's first byte, ``end`` one past its value."""

    id: int
    kind: int
    value: object
    start: int
    end: int


def read_struct(buf: bytes | memoryview, at: int = 0) -> tuple[list[Field], int]:
    """The struct at ``at``: its fields, and the offset one past its stop byte."""
    out: list[Field] = []
    last = 0
    try:
        while True:
            start = at
            head = buf[at]
            at += 1
            if head == 0:
                return out, at
            kind, delta = head & 0x0F, head >> 4
            if delta:
                fid = last + delta
            else:
                raw, at = _varint(buf, at)
                fid = _unzigzag(raw)
            value, at = _value(buf, at, kind)
            out.append(Field(fid, kind, value, start, at))
            last = fid
    except IndexError:
        raise ThriftError(f"the struct runs past the end of its {len(buf)} bytes") from None


def _varint(buf: bytes | memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, at
        if shift > 70:
            raise ThriftError("a varint longer than ten bytes")


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(buf: bytes | memoryview, at: int, kind: int) -> tuple[object, int]:
    if kind in (TRUE, FALSE):
        return kind == TRUE, at
    if kind == BYTE:
        return buf[at], at + 1
    if kind in (I16, I32, I64):
        raw, at = _varint(buf, at)
        return _unzigzag(raw), at
    if kind == DOUBLE:
        return struct.unpack_from("<d", buf, at)[0], at + 8
    if kind == BINARY:
        size, at = _varint(buf, at)
        if at + size > len(buf):
            raise IndexError
        return bytes(buf[at:at + size]), at + size
    if kind == STRUCT:
        return read_struct(buf, at)
    if kind in (LIST, SET):
        head = buf[at]
        at += 1
        size, element = head >> 4, head & 0x0F
        if size == 15:
            size, at = _varint(buf, at)
        items: list[object] = []
        for _ in range(size):
            if element in (TRUE, FALSE):  # a list's bools are a byte each
                items.append(buf[at] == TRUE)
                at += 1
                continue
            item, at = _value(buf, at, element)
            items.append(item)
        return items, at
    raise ThriftError(f"compact type {kind} is not read here")


def as_dict(fields: list[Field]) -> dict[int, object]:
    """A struct as ``{field id: value}``, nested structs (and lists of them) too: what
    tests compare."""

    def plain(value: object) -> object:
        if isinstance(value, list):
            if value and isinstance(value[0], Field):
                return as_dict(value)
            return [plain(v) for v in value]
        return value

    return {f.id: plain(f.value) for f in fields}
