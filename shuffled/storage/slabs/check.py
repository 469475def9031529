"""What a slab's client declares, checked before the daemon believes it.

- the index and statistics sections: small Arrow streams (bounded by settings), their batch
  declarations checked (:mod:`..ipcshape`) before pyarrow reads them, then their schemas
  and values (:func:`shuffled.slab.wire.check_index`);
- the data section, from its messages' metadata alone: a schema message without
  dictionaries, then exactly the record batches the index names, at its offsets, of its
  lengths and rows, every batch's declarations checked against the schema at once (numpy
  gathers, no Python per batch), then the end-of-stream marker. A read trusts the index
  afterwards: it points at whole, valid batches and nowhere else.
"""

from __future__ import annotations

import struct
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shuffled.errors import InvalidBody
from shuffled.slab import wire
from shuffled.slab.wire import KEY_COLUMN, KeyKind
from shuffled.storage.ondisk import ipcshape, messages

_HEAD = struct.Struct("<Ii")
_MAX_SCHEMA = 1 << 20


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


class Section(Protocol):
    """A slab's data section as the check reads it."""

    size: int

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (a few: the schema message, the end marker)."""

    def mapped(self, offset: int, length: int) -> AbstractContextManager[npt.NDArray[np.uint8]]:
        """Bytes ``[offset, offset + length)`` as an array, while the block lasts."""


# Bytes of the section mapped at a time, so at most this much of it enters the daemon's
# resident set: the kernel maps the cached pages around each page touched (64 KiB), so the
# metadata of a slab of small batches maps all of it (a whole-section mapping raised
# comparison 3's peak RSS by 64 MiB, 16 MiB windows by 20, against a 150 MiB target). A
# window costs a dozen numpy calls (its messages' heads, one gather of their metadata); the
# flatbuffer checks run on the gathered metadata, GATHER bytes at a time.
WINDOW = 4 << 20
GATHER = 1 << 20  # bytes of metadata gathered (and its index: 4 bytes a byte) per check


def data_section(section: Section, kind: KeyKind, index: pa.Table,
                 window: int = WINDOW) -> pa.Schema:
    """Check the data section against ``index``: a schema message, then exactly the batches
    the index names, end to end, then the end-of-stream marker. Every batch's declarations
    are read and checked together (:mod:`..messages`: heads, metadata, declarations), a ``window`` of
    batches at a time: each window is mapped, its messages' metadata read, and unmapped, so
    that the metadata pages touched across a large slab (the kernel maps 64 KiB around each)
    never sit in the daemon's resident set at once. No body is read. The section's bytes as
    a whole were checked against the header's CRC32C as they arrived; each batch's own
    CRC32C is checked when a read decodes it (an edge batch)."""
    end = section.size
    head = section.read(0, min(end, 8 + _MAX_SCHEMA))
    schema, at = _schema_at(memoryview(head), 0, len(head))
    schema_of(kind, schema)
    offsets = index.column("offset").to_numpy().astype(np.int64)
    lengths = index.column("length").to_numpy().astype(np.int64)
    rows = index.column("rows").to_numpy().astype(np.int64)
    starts = np.concatenate(([at], offsets[:-1] + lengths[:-1])) if len(offsets) else offsets
    moved = offsets != starts
    if moved.any():
        i = int(np.argmax(moved))
        raise InvalidBody(f"a slab's index puts batch {i} at {offsets[i]}; its batches "
                          f"before end at {starts[i]}")
    tail = int(offsets[-1] + lengths[-1]) if len(offsets) else at
    if end - tail != len(wire.EOS) or section.read(tail, end - tail) != wire.EOS:
        raise InvalidBody("a slab's data section does not end with its last batch and the "
                          "end-of-stream marker")
    layout = ipcshape.layout(schema)
    ids = np.arange(len(offsets), dtype=np.int64)
    pending = _Pending(layout, lengths, rows)
    # Windows start at a batch; a batch larger than a window is a window of its own.
    cuts = np.flatnonzero(np.diff((offsets - at) // window)) + 1
    bounds = np.concatenate(([0], cuts, [len(offsets)])).tolist() if len(offsets) else [0]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):  # per window, not per batch
        first, last = int(offsets[lo]), int(offsets[hi - 1] + lengths[hi - 1])
        rel = offsets[lo:hi] - first
        with section.mapped(first, last - first) as data:
            meta_len = messages.heads(data, rel, lengths[lo:hi], ids[lo:hi])
            # One gather per GATHER bytes of metadata: one a window, unless its batches are
            # mostly metadata (never so from Arrow's writer). A gather holds at most GATHER
            # plus one message's MAX_METADATA bytes (and 4 bytes of index a byte).
            cut = [] if int(meta_len.sum()) <= GATHER else (np.flatnonzero(np.diff(
                (np.cumsum(meta_len) - meta_len) // GATHER)) + 1).tolist()
            for a, b in zip([0, *cut], [*cut, hi - lo], strict=True):
                pending.add(messages.metadata(data, rel[a:b] + 8, meta_len[a:b]),
                            meta_len[a:b], ids[lo + a: lo + b])
            del data  # the mapping closes at the block's end only once nothing views it
        if pending.size >= GATHER:
            pending.check()
    pending.check()
    return schema


class _Pending:
    """Metadata gathered from the windows, checked :data:`GATHER` bytes at a time."""

    def __init__(self, layout: ipcshape.Layout, lengths: npt.NDArray[np.int64],
                 rows: npt.NDArray[np.int64]) -> None:
        self.layout, self.lengths, self.rows = layout, lengths, rows
        self.parts: list[tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64],
                               npt.NDArray[np.int64]]] = []
        self.size = 0

    def add(self, meta: npt.NDArray[np.uint8], meta_len: npt.NDArray[np.int64],
            ids: npt.NDArray[np.int64]) -> None:
        self.parts.append((meta, meta_len, ids))
        self.size += len(meta)

    def check(self) -> None:
        if not self.parts:
            return
        meta, meta_len, ids = (np.concatenate(p) for p in zip(*self.parts, strict=True))
        self.parts, self.size = [], 0
        declared = messages.declarations(meta, meta_len, self.layout, ids)
        _agree(declared, self.lengths[ids], self.rows[ids], ids)


def _agree(declared: messages.Declared, lengths: npt.NDArray[np.int64],
           rows: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]) -> None:
    """The batches' declarations against their index rows."""
    sized = 8 + declared.meta_len + declared.body_len != lengths
    if sized.any():
        i = int(np.argmax(sized))
        raise InvalidBody(f"a slab's batch {int(ids[i])} is "
                          f"{int(8 + declared.meta_len[i] + declared.body_len[i])} bytes; "
                          f"its index says {lengths[i]}")
    counted = declared.rows != rows
    if counted.any():
        raise InvalidBody(f"a slab's batch {int(ids[np.argmax(counted)])} declares other "
                          "rows than its index")


def key_bounds(index: pa.Table, kind: KeyKind) -> None:
    """Each batch's key_lo <= key_hi (keyed slabs)."""
    if kind == KeyKind.NONE or not index.num_rows:
        return
    import pyarrow.compute as pc  # here, not at import: ~12 MiB the daemon needs for slabs only

    lo, hi = index.column("key_lo"), index.column("key_hi")
    if lo.null_count or hi.null_count or not pc.all(pc.less_equal(lo, hi)).as_py():
        raise InvalidBody("a slab's index has a batch whose key_lo is above its key_hi")
