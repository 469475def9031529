"""What a slab's client declares, checked before the daemon believes it.

- the index and statistics sections: small Arrow streams (bounded by settings), their batch
  declarations checked (:mod:`..ipcshape`) before pyarrow reads them, then their schemas
  and values (:func:`shuffled.slab.wire.check_index`);
- the data section, walked message by message from its metadata alone: a schema message
  without dictionaries, then exactly the record batches the index names, at its offsets,
  of its lengths and rows, each batch's declarations checked against the schema, then the
  end-of-stream marker, reading only metadata. A read trusts the index afterwards: it
  points at whole, valid batches and nowhere else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pyarrow as pa

from shuffled.errors import InvalidBody
from shuffled.slab import wire
from shuffled.slab.wire import KEY_COLUMN, KeyKind
from shuffled.storage.ondisk import ipcshape

_HEAD = struct.Struct("<Ii")
_RECORD_BATCH = 3
_MAX_SCHEMA = 1 << 20
_PEEK = 1024  # bytes read at a batch's start: its metadata, mostly


def _schema_at(data: memoryview, at: int, end: int) -> tuple[pa.Schema, int]:
    """The schema message at ``at``: the schema and where the next message starts."""
    if at + 8 > end:
        raise InvalidBody("a slab's data section is too short to hold a schema")
    marker, meta_len = _HEAD.unpack_from(data, at)
    if marker != 0xFFFFFFFF or not 0 < meta_len <= _MAX_SCHEMA or at + 8 + meta_len > end:
        raise InvalidBody("a slab's data section does not start with an Arrow schema message")
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(bytes(data[at: at + 8 + meta_len])))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as exc:
        raise InvalidBody(f"a slab's data section starts with no schema: {exc}") from exc
    return schema, at + 8 + meta_len


def small_section(data: bytes, schema: pa.Schema, what: str) -> pa.Table:
    """The index or statistics section, declarations checked, read whole."""
    view = memoryview(data)
    got, at = _schema_at(view, 0, len(view))
    if not got.equals(schema):
        raise InvalidBody(f"a slab's {what} section has schema {got}")
    walker = ipcshape.Walker(view, at, len(view), schema)
    walker.all()
    return wire.read_ipc(data, schema, what)


def schema_of(kind: KeyKind, schema: pa.Schema) -> None:
    if any(pa.types.is_dictionary(f.type) for f in schema):
        raise InvalidBody("slab version 1 carries no dictionary-encoded columns")
    if kind != KeyKind.NONE:
        field = schema.field(KEY_COLUMN) if KEY_COLUMN in schema.names else None
        if field is None or field.type != pa.binary():
            raise InvalidBody(f"a keyed slab carries its key as a binary {KEY_COLUMN} column")


def data_section(read: Callable[[int, int], bytes], data_len: int, kind: KeyKind,
                 index: pa.Table) -> pa.Schema:
    """Walk the data section (``read(offset, length)`` gives its bytes) against ``index``:
    only the messages' metadata is read (a few hundred bytes a batch), never a body. The
    section's bytes as a whole were checked against the header's CRC32C as they arrived;
    each batch's own CRC32C is checked when a read decodes it (an edge batch)."""
    end = data_len
    head = read(0, min(end, 8 + _MAX_SCHEMA))
    schema, at = _schema_at(memoryview(head), 0, len(head))
    schema_of(kind, schema)
    batch = ipcshape.layout(schema)
    offsets = index.column("offset").to_numpy()
    lengths = index.column("length").to_numpy()
    rows = index.column("rows").to_numpy()
    for i in range(len(offsets)):
        if at != offsets[i]:
            raise InvalidBody(f"a slab's index puts batch {i} at {offsets[i]}; the data "
                              f"section has a message at {at}")
        first = read(at, min(_PEEK, end - at)) if at + 8 <= end else b""
        marker, meta_len = _HEAD.unpack_from(first, 0) if len(first) >= 8 else (0, 0)
        if marker != 0xFFFFFFFF or meta_len <= 0 or at + 8 + meta_len > end:
            raise InvalidBody(f"a slab's batch {i} is not an Arrow message")
        meta = first[8: 8 + meta_len] if 8 + meta_len <= len(first) \
            else read(at + 8, meta_len)
        kind_, body_len = ipcshape.check_message(meta, batch, {})
        if kind_ != _RECORD_BATCH:
            raise InvalidBody(f"a slab's batch {i} is not a record batch (slab version 1 "
                              "carries record batches only)")
        nxt = at + 8 + meta_len + body_len
        if nxt - at != lengths[i] or nxt > end:
            raise InvalidBody(f"a slab's batch {i} is {nxt - at} bytes; its index says "
                              f"{lengths[i]}")
        if ipcshape.record_batch_rows(meta) != rows[i]:
            raise InvalidBody(f"a slab's batch {i} declares other rows than its index")
        at = nxt
    if end - at != len(wire.EOS) or read(at, end - at) != wire.EOS:
        raise InvalidBody("a slab's data section does not end with its last batch and the "
                          "end-of-stream marker")
    return schema


def key_bounds(index: pa.Table, kind: KeyKind) -> None:
    """Each batch's key_lo <= key_hi (keyed slabs)."""
    if kind == KeyKind.NONE or not index.num_rows:
        return
    lo = index.column("key_lo").to_pylist()
    hi = index.column("key_hi").to_pylist()
    if any(a is None or b is None or a > b for a, b in zip(lo, hi, strict=True)):
        raise InvalidBody("a slab's index has a batch whose key_lo is above its key_hi")
