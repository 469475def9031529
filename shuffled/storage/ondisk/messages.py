"""The record batch messages of a stream whose positions are known in advance (a slab's data
section, placed by its index), their declarations read and checked all at once in numpy.

:mod:`.ipcshape` reads one message's flatbuffer with a few struct reads: right for a
stream walked as it is read, but a Python loop per batch on a slab's receive path, where a
flush cut into a thousand batches arrives as one request. Here each flatbuffer field is
one gather over every message: positions as an array, bounds checked as an array, values
read as an array. The checks and their limits are :mod:`.ipcshape`'s (a test holds the two
to the same verdicts on fuzzed metadata); a field read outside its message's metadata
refuses the stream, as a struct read past a slice does there.

Flatbuffers layout: https://flatbuffers.dev/internals/ (a table starts with the signed
offset back to its vtable; the vtable holds its own size, then a u16 offset per field, 0
when absent; an offset field (a table or vector) holds a u32 forward offset). Message.fbs:
Message{version, header_type, header, bodyLength, custom_metadata}; RecordBatch{length,
nodes, buffers, compression, variadicBufferCounts}.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shuffled.errors import InvalidBody
from shuffled.storage.ondisk import ipcshape

_RECORD_BATCH = 3
_CONTINUATION = 0xFFFFFFFF

Positions = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Declared:
    """What each message declares (one entry per message, in order)."""

    meta_len: Positions
    body_len: Positions
    rows: Positions


class _Messages:
    """Gathers from ``data`` (the stream's bytes) at positions relative to each message's
    metadata, refusing any read outside it."""

    def __init__(self, data: npt.NDArray[np.uint8], meta_at: Positions,
                 meta_len: Positions, ids: Positions) -> None:
        self.data = data
        self.lo = meta_at
        self.hi = meta_at + meta_len
        self.ids = ids  # each message's batch number, for errors

    def read(self, pos: Positions, dtype: str, what: str) -> npt.NDArray[np.int64]:
        width = np.dtype(dtype).itemsize
        outside = (pos < self.lo) | (pos + width > self.hi)
        if outside.any():
            i = int(self.ids[np.argmax(outside)])
            raise InvalidBody(f"an Arrow message's metadata is malformed: batch {i}'s {what} "
                              "lies outside its metadata")
        gathered = self.data[pos[:, None] + np.arange(width)]
        return np.ascontiguousarray(gathered).view(dtype).ravel().astype(np.int64)

    def table(self, pos: Positions, what: str) -> tuple[Positions, Positions]:
        """The tables at ``pos``: where their vtables are, and the vtables' sizes."""
        vtable = pos - self.read(pos, "<i4", f"{what}'s vtable offset")
        return vtable, self.read(vtable, "<u2", f"{what}'s vtable size")

    def field(self, pos: Positions, vtable: Positions, vsize: Positions, index: int,
              what: str) -> tuple[npt.NDArray[np.bool_], Positions]:
        """Field ``index`` of the tables at ``pos``: whether present, and where."""
        at = 4 + 2 * index
        has_slot = at < vsize
        offset = self._read_where(has_slot, vtable + at, "<u2", what)
        present = offset != 0
        return present, pos + offset

    def scalar(self, pos: Positions, vtable: Positions, vsize: Positions, index: int,
               dtype: str, what: str) -> Positions:
        present, at = self.field(pos, vtable, vsize, index, what)
        return self._read_where(present, at, dtype, what)

    def forward(self, pos: Positions, vtable: Positions, vsize: Positions, index: int,
                what: str) -> tuple[npt.NDArray[np.bool_], Positions]:
        """An offset field (a table or a vector): whether present, and what it points at."""
        present, at = self.field(pos, vtable, vsize, index, what)
        return present, np.where(present, at + self._read_where(present, at, "<u4", what),
                                 self.lo)

    def vector_len(self, pos: Positions, vtable: Positions, vsize: Positions, index: int,
                   what: str) -> Positions:
        present, vec = self.forward(pos, vtable, vsize, index, what)
        return self._read_where(present, vec, "<u4", what)

    def _read_where(self, mask: npt.NDArray[np.bool_], pos: Positions, dtype: str,
                    what: str) -> Positions:
        """``read`` where ``mask`` holds; elsewhere 0 (and nothing read there)."""
        if mask.all():
            return self.read(pos, dtype, what)
        out = np.zeros(len(pos), np.int64)
        if mask.any():
            sub = _Messages(self.data, self.lo[mask], self.hi[mask] - self.lo[mask],
                            self.ids[mask])
            out[mask] = sub.read(pos[mask], dtype, what)
        return out


MAX_METADATA = 1 << 20  # bytes of one record batch's metadata (a column's is ~50)


def heads(data: npt.NDArray[np.uint8], offsets: Positions, lengths: Positions,
          ids: Positions) -> Positions:
    """The metadata lengths of the messages at ``offsets`` of ``data`` (``lengths`` bytes
    each: continuation marker, metadata, body), after checking that each starts as an
    Arrow message whose metadata fits in it and is at most :data:`MAX_METADATA` bytes (its
    gather costs 5 bytes a byte: a client's declared length must not size it). ``ids``
    name them in errors."""
    if not len(offsets):
        return np.zeros(0, np.int64)
    outside = (offsets < 0) | (offsets + lengths > len(data)) | (lengths < 8)
    _refuse(outside, "is not an Arrow message", ids)
    head = np.ascontiguousarray(data[offsets[:, None] + np.arange(8)]).view("<u4")
    meta_len = head[:, 1].view("<i4").astype(np.int64)
    bad = (head[:, 0] != _CONTINUATION) | (meta_len <= 0) | (8 + meta_len > lengths)
    _refuse(bad, "is not an Arrow message", ids)
    _refuse(meta_len > MAX_METADATA, f"declares more than {MAX_METADATA} bytes of metadata "
            "(a record batch's is tens of bytes a column)", ids)
    return meta_len


def metadata(data: npt.NDArray[np.uint8], meta_at: Positions,
             meta_len: Positions) -> npt.NDArray[np.uint8]:
    """The metadata of each message (``meta_len`` bytes at ``meta_at``), back to back: one
    gather. The caller bounds ``meta_len.sum()``: the gather's index takes 4 bytes a byte
    (8 in a mapping past 2 GiB)."""
    kind = np.int32 if len(data) < (1 << 31) else np.int64
    total = int(meta_len.sum())
    begins = np.cumsum(meta_len) - meta_len
    index = np.repeat((meta_at - begins).astype(kind), meta_len) + np.arange(total, dtype=kind)
    gathered: npt.NDArray[np.uint8] = data[index]
    return gathered


def declarations(meta: npt.NDArray[np.uint8], meta_len: Positions, batch: ipcshape.Layout,
                 ids: Positions) -> Declared:
    """Check the record batch messages whose metadata lie back to back in ``meta``
    (:func:`metadata`) against the schema's ``batch`` layout; what they declare. Raises
    InvalidBody for the first message (by check, then position) that fails."""
    if not len(meta_len):
        empty = np.zeros(0, np.int64)
        return Declared(empty, empty, empty)
    meta_at = np.cumsum(meta_len) - meta_len
    msgs = _Messages(meta, meta_at, meta_len, ids)

    message = meta_at + msgs.read(meta_at, "<u4", "root offset")
    vt, vs = msgs.table(message, "message")
    kind = msgs.scalar(message, vt, vs, 1, "<u1", "header type")
    has_header, header = msgs.forward(message, vt, vs, 2, "header")
    body_len = msgs.scalar(message, vt, vs, 3, "<i8", "body length")
    _refuse(body_len < 0, "declares a body of negative length", ids)
    _refuse(kind == 1, "is a second schema message inside one stream", ids)
    _refuse((kind != _RECORD_BATCH) | ~has_header,
            "is not a record batch (slab version 1 carries record batches only)", ids)

    hvt, hvs = msgs.table(header, "record batch")
    rows = msgs.scalar(header, hvt, hvs, 0, "<i8", "rows")
    nodes = msgs.vector_len(header, hvt, hvs, 1, "field nodes")
    buffers = msgs.vector_len(header, hvt, hvs, 2, "buffers")
    _refuse(nodes != batch.nodes, f"has other field nodes than its schema's {batch.nodes} "
            "fields: it was not written for this schema", ids)
    if batch.buffers is not None:
        _refuse(buffers != batch.buffers, f"has other buffers than its schema's columns' "
                f"{batch.buffers}: it was not written for this schema", ids)
    limit = ipcshape.ROWS_PER_BYTE * body_len + ipcshape.ROWS_FREE
    over = (rows < 0) | (rows > limit)
    if over.any():
        i = int(np.argmax(over))
        raise InvalidBody(f"a slab's batch {int(ids[i])} declares {int(rows[i])} rows in a "
                          f"body of {int(body_len[i])} bytes (at most "
                          f"{ipcshape.ROWS_PER_BYTE} rows a byte plus {ipcshape.ROWS_FREE} "
                          "are accepted): refused, reading it would cost memory it does not "
                          "carry")
    return Declared(meta_len, body_len, rows)


def _refuse(bad: npt.NDArray[np.bool_], why: str, ids: Positions) -> None:
    if bad.any():
        raise InvalidBody(f"a slab's batch {int(ids[np.argmax(bad)])} {why}")
