"""The seed's aggregate GET: every partial segment of a partition as ONE Arrow IPC stream.

Fast path (all partial segments share the exact schema message and use no dictionaries):
the first file's schema message, then each file's batch messages sent zero-copy from
disk, then one end-of-stream marker. Its length and CRC32C are known from stored facts
before a byte is sent, so it carries Content-Length and Content-Digest.

Slow path (schemas differ): unify them (missing columns become nulls, types promoted)
and re-encode batch by batch on the I/O threads, in bounded memory; or refuse with 409
when they cannot be unified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from shuffled.crc import combine
from shuffled.errors import Conflict
from shuffled.storage.arrowfile import EOS, EOS_CRC, schema_has_dictionaries
from shuffled.storage.index import PartialMeta


@dataclass(frozen=True, slots=True)
class Piece:
    file: int  # index into the opened files
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class FastPlan:
    pieces: list[Piece]
    length: int
    crc: int
    rows: int


def fast_plan(metas: Sequence[PartialMeta]) -> FastPlan | None:
    """The zero-copy plan, or None when the slow path is needed."""
    first = metas[0]
    if any(m.has_dictionaries or m.schema_crc != first.schema_crc
           or m.schema_len != first.schema_len for m in metas):
        return None
    pieces = [Piece(0, 0, first.schema_len)]
    crc, length = first.schema_crc, first.schema_len
    for i, meta in enumerate(metas):
        body_len = meta.size - meta.schema_len - len(EOS)
        pieces.append(Piece(i, meta.schema_len, body_len))
        crc = combine(crc, meta.body_crc, body_len)
        length += body_len
    return FastPlan(pieces, length + len(EOS), combine(crc, EOS_CRC, len(EOS)),
                    sum(m.rows for m in metas))


def unified_schema(files: Sequence[IO[bytes]], metas: Sequence[PartialMeta]) -> pa.Schema:
    """Read each stream's schema and unify them; 409 naming the subtasks if impossible."""
    schemas = []
    for fh in files:
        fh.seek(0)
        schemas.append(pa.ipc.open_stream(fh).schema)
    try:
        unified = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        subs = [m.key.sub_task_id for m in metas]
        raise Conflict(
            f"partial segments of this partition have schemas that cannot be unified "
            f"({exc}); fetch them one by one with the per-subtask GET",
            subTaskIds=subs[:50],
        ) from exc
    return unified


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
        else:
            column = batch.column(index)
            columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class _ChunkSink:
    """A file-like sink collecting what pyarrow's stream writer emits."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


class Reencoder:
    """Re-encodes several streams into one with ``schema``, one batch per :meth:`next`.

    Every method blocks; the handler calls them on the I/O threads.
    """

    def __init__(self, files: Sequence[IO[bytes]], schema: pa.Schema) -> None:
        self._files = list(files)
        self._schema = schema
        self._sink = _ChunkSink()
        self._writer = pa.ipc.new_stream(self._sink, schema)
        self._reader: pa.ipc.RecordBatchStreamReader | None = None
        self._done = False
        self.rows = 0

    def next(self) -> bytes | None:
        """The next piece of the output stream, or None after the end-of-stream marker."""
        if self._done:
            return None
        while True:
            if self._reader is None:
                if not self._files:
                    self._writer.close()
                    self._done = True
                    return self._sink.take()
                fh = self._files.pop(0)
                fh.seek(0)
                self._reader = pa.ipc.open_stream(fh)
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                self._reader = None
                continue
            self._writer.write_batch(_conform(batch, self._schema))
            self.rows += batch.num_rows
            return self._sink.take()


__all__ = ["FastPlan", "Reencoder", "fast_plan", "schema_has_dictionaries", "unified_schema"]
