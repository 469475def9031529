"""What an Arrow IPC stream's batch messages declare, read from their flatbuffers, checked
against the schema and the bytes that carry them.

pyarrow's reader trusts a message's declarations: a record batch may declare 2^34 rows of
a null-type column (which has no buffers) in a 224-byte body, and a read that fills a
missing column for every declared row then allocates gigabytes; a batch with more field
nodes or buffers than its schema reads back as other columns' bytes (float bits as
int64). So every record and dictionary batch of an upload is held to:

- its field nodes and buffers: exactly as many as its schema's layout has;
- its rows: at most :data:`ROWS_PER_BYTE` per byte of its body, plus
  :data:`ROWS_FREE` (a row costs at least a validity bit in some buffer, except in
  null-type columns; a batch of those alone is allowed a little, not gigabytes).

The walk reads only the metadata (a few struct reads per message) and no body bytes.
Flatbuffers layout: https://flatbuffers.dev/internals/ ; Arrow's Message.fbs and
Schema.fbs name the fields read here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

from shuffled.errors import InvalidBody

CONTINUATION = b"\xff\xff\xff\xff"
ROWS_PER_BYTE = 8
ROWS_FREE = 1 << 16

# Message.fbs: MessageHeader union types.
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3

_HEAD = struct.Struct("<Ii")  # a message's continuation marker and metadata length
_CONTINUATION_U32 = 0xFFFFFFFF
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")


class _Table:
    """A flatbuffer table at ``pos`` of ``buf``: its fields by index, or None if absent."""

    __slots__ = ("buf", "pos", "vtable", "vsize")

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = pos - _I32.unpack_from(buf, pos)[0]
        if self.vtable < 0:  # struct would read it from the end of the metadata
            raise IndexError(f"a vtable at {self.vtable}, before its metadata")
        self.vsize = _U16.unpack_from(buf, self.vtable)[0]

    def _field(self, index: int) -> int | None:
        at = 4 + 2 * index
        if at >= self.vsize:
            return None
        offset = _U16.unpack_from(self.buf, self.vtable + at)[0]
        return self.pos + offset if offset else None

    def scalar(self, index: int, fmt: struct.Struct, default: int = 0) -> int:
        at = self._field(index)
        return default if at is None else int(fmt.unpack_from(self.buf, at)[0])

    def table(self, index: int) -> _Table | None:
        at = self._field(index)
        return None if at is None else _Table(self.buf, at + _U32.unpack_from(self.buf, at)[0])

    def vector_len(self, index: int) -> int:
        at = self._field(index)
        if at is None:
            return 0
        return int(_U32.unpack_from(self.buf, at + _U32.unpack_from(self.buf, at)[0])[0])


@dataclass(frozen=True, slots=True)
class Layout:
    """What a record batch of a schema carries: field nodes and buffers (None: the buffer
    count varies, as with view types' variadic buffers: not checked)."""

    nodes: int
    buffers: int | None


def _buffers(typ: pa.DataType) -> tuple[int, int | None]:
    """(nodes, buffers) of one column of type ``typ``, children included."""
    if pa.types.is_dictionary(typ):
        return _buffers(typ.index_type)  # the values travel in dictionary batches
    if pa.types.is_null(typ):
        return 1, 0
    if (pa.types.is_string(typ) or pa.types.is_binary(typ) or pa.types.is_large_string(typ)
            or pa.types.is_large_binary(typ)):
        return 1, 3
    if pa.types.is_string_view(typ) or pa.types.is_binary_view(typ):
        return 1, None
    own: int | None
    if pa.types.is_struct(typ):
        own = 1
    elif pa.types.is_fixed_size_list(typ):
        own = 1
    elif (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_map(typ)):
        own = 2
    elif pa.types.is_union(typ):
        own = 2 if typ.mode == "dense" else 1
    elif pa.types.is_run_end_encoded(typ):
        own = 0
    elif typ.num_fields:
        own = None  # list views and anything newer: count the nodes only
    else:
        own = 2  # fixed width: validity and values
    nodes = 1
    buffers = own
    for i in range(typ.num_fields):
        n, b = _buffers(typ.field(i).type)
        nodes += n
        buffers = None if buffers is None or b is None else buffers + b
    return nodes, buffers


def layout(schema: pa.Schema) -> Layout:
    nodes = 0
    buffers: int | None = 0
    for field in schema:
        n, b = _buffers(field.type)
        nodes += n
        buffers = None if buffers is None or b is None else buffers + b
    return Layout(nodes, buffers)


@dataclass(frozen=True, slots=True)
class Shape:
    """A schema's layouts, as :class:`Walker` holds batches to them: its record batches'
    and, per dictionary id, its dictionary batches'."""

    batch: Layout
    dictionaries: dict[int, Layout]

    @classmethod
    def of(cls, schema: pa.Schema) -> Shape:
        return cls(layout(schema), dictionary_layouts(schema))


def dictionary_layouts(schema: pa.Schema) -> dict[int, Layout]:
    """Per dictionary id, the layout of its dictionary batches (one column of the value
    type). Ids are given in schema order, depth first, as pyarrow's writer numbers them."""
    out: dict[int, Layout] = {}

    def walk(typ: pa.DataType) -> None:
        if pa.types.is_dictionary(typ):
            out[len(out)] = Layout(*_buffers(typ.value_type))
            walk(typ.value_type)
            return
        for i in range(typ.num_fields):
            walk(typ.field(i).type)

    for field in schema:
        walk(field.type)
    return out


def check_message(metadata: bytes | memoryview, batch: Layout,
                  dictionaries: dict[int, Layout]) -> tuple[int, int]:
    """Check one message's declarations (its flatbuffer ``metadata``) against the schema's
    layouts; returns its kind (a MessageHeader type) and its body's length, or raises
    InvalidBody naming what is wrong."""
    buf = metadata  # read in place: struct reads a memoryview as it is
    try:
        message = _Table(buf, _U32.unpack_from(buf, 0)[0])
        kind = message.scalar(1, _U8)
        header = message.table(2)
        body_len = message.scalar(3, _I64)
        if body_len < 0:
            raise InvalidBody(f"an Arrow message declares a body of {body_len} bytes")
        if kind == _DICTIONARY_BATCH and header is not None:
            ident = header.scalar(0, _I64)
            expected = dictionaries.get(ident)
            data = header.table(1)
            if expected is None or data is None:
                raise InvalidBody(f"a dictionary batch names dictionary {ident}, which the "
                                  "schema does not have")
            _check_batch(data, body_len, expected, "dictionary batch")
        elif kind == _RECORD_BATCH and header is not None:
            _check_batch(header, body_len, batch, "record batch")
        elif kind == _SCHEMA:
            raise InvalidBody("a second schema message inside one stream")
        return kind, body_len
    except (struct.error, IndexError) as exc:
        raise InvalidBody(f"an Arrow message's metadata is malformed: {exc}") from exc


def record_batch_rows(metadata: bytes | memoryview) -> int:
    """The rows a record batch message declares (after :func:`check_message` passed it)."""
    message = _Table(metadata, _U32.unpack_from(metadata, 0)[0])
    header = message.table(2)
    return 0 if header is None else header.scalar(0, _I64)


class Walker:
    """Checks the messages of ``data[start:end]`` (a stream's messages after its schema
    message) with :func:`check_message`, a record batch at a time, so that a reader
    following it touches the same pages at the same time. Stops quietly where the bytes
    stop looking like messages: the Arrow reader refuses those with its own words."""

    def __init__(self, data: memoryview, start: int, end: int, schema: pa.Schema,
                 shape: Shape | None = None) -> None:
        # ``shape``: the schema's, worked out already (a schema message's, remembered
        # with it: working it out was half of checking a 64 KiB single PUT).
        self.data = data
        self.at = start
        self.end = end
        shape = shape or Shape.of(schema)
        self.batch = shape.batch
        self.dictionaries = shape.dictionaries

    def next_batch(self) -> None:
        """Check the messages up to and including the next record batch."""
        data, end = self.data, self.end
        while self.at + 8 <= end:
            at = self.at
            marker, meta_len = _HEAD.unpack_from(data, at)
            if marker != _CONTINUATION_U32:
                self.at = end
                return
            if meta_len <= 0 or at + 8 + meta_len > end:
                self.at = end
                return
            kind, body_len = check_message(data[at + 8: at + 8 + meta_len], self.batch,
                                           self.dictionaries)
            self.at = at + 8 + meta_len + body_len
            if kind == _RECORD_BATCH:
                return

    def all(self) -> None:
        """Check every message."""
        while self.at + 8 <= self.end:
            self.next_batch()


def _check_batch(batch: _Table, body_len: int, expected: Layout, what: str) -> int:
    rows = batch.scalar(0, _I64)
    nodes = batch.vector_len(1)
    buffers = batch.vector_len(2)
    if nodes != expected.nodes:
        raise InvalidBody(f"a {what} has {nodes} field nodes where its schema has "
                          f"{expected.nodes} fields: it was not written for this schema")
    if expected.buffers is not None and buffers != expected.buffers:
        raise InvalidBody(f"a {what} has {buffers} buffers where its schema's columns have "
                          f"{expected.buffers}: it was not written for this schema")
    if rows < 0 or rows > ROWS_PER_BYTE * body_len + ROWS_FREE:
        raise InvalidBody(f"a {what} declares {rows} rows in a body of {body_len} bytes "
                          f"(at most {ROWS_PER_BYTE} rows a byte plus {ROWS_FREE} are "
                          "accepted): refused, reading it would cost memory it does not "
                          "carry")
    return rows
