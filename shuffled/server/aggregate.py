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

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from shuffled.crc import combine, crc32c
from shuffled.errors import Conflict, CorruptData
from shuffled.protocol import crc_hex
from shuffled.storage.arrowfile import EOS, EOS_CRC, schema_has_dictionaries
from shuffled.storage.index import PartialMeta


VERIFY_CHUNK = 1 << 20


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
    pieces = [Piece(0, first.offset, first.schema_len)]
    crc, length = first.schema_crc, first.schema_len
    for i, meta in enumerate(metas):
        body_len = meta.size - meta.schema_len - len(EOS)
        pieces.append(Piece(i, meta.offset + meta.schema_len, body_len))
        crc = combine(crc, meta.body_crc, body_len)
        length += body_len
    return FastPlan(pieces, length + len(EOS), combine(crc, EOS_CRC, len(EOS)),
                    sum(m.rows for m in metas))


def verify_files(files: Sequence[IO[bytes]], metas: Sequence[PartialMeta]) -> None:
    """Check each file against the CRC32C stored at upload; CorruptData naming the partial
    segment if one differs. The slow path needs this: a re-encoded stream carries no digest
    the reader could check, so damage on disk would otherwise reach a segment unnoticed."""
    for fh, meta in zip(files, metas, strict=True):
        crc, done = 0, 0
        while done < meta.size:
            chunk = os.pread(fh.fileno(), min(VERIFY_CHUNK, meta.size - done), meta.offset + done)
            if not chunk:
                break
            crc = crc32c(chunk, crc)
            done += len(chunk)
        if crc != meta.crc:
            raise CorruptData(
                f"partial segment {meta.key} is corrupt on disk: CRC32C {crc_hex(crc)}, "
                f"stored at upload {crc_hex(meta.crc)}; re-run the subtask that wrote it",
                key=str(meta.key), supervisorTaskId=meta.key.supervisor_task_id,
                subTaskId=meta.key.sub_task_id, partitionId=meta.key.partition_id,
            )


def unified_schema(files: Sequence[IO[bytes]], metas: Sequence[PartialMeta]) -> pa.Schema:
    """Verify each file (:func:`verify_files`), read each stream's schema and unify them;
    409 naming the subtasks if impossible."""
    verify_files(files, metas)
    schemas = [pa.ipc.open_stream(stream_of(meta)).schema for meta in metas]
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


def stream_of(meta: PartialMeta) -> pa.BufferReader:
    """The partial segment's bytes in its pack, memory-mapped (no copy into the heap)."""
    source = pa.memory_map(str(meta.path), "r")  # unmapped when the buffer is released
    source.seek(meta.offset)
    return pa.BufferReader(source.read_buffer(meta.size))


class Reencoder:
    """Re-encodes several streams into one with ``schema``, one batch per :meth:`next`.

    Every method blocks; the handler calls them on the I/O threads.
    """

    def __init__(self, metas: Sequence[PartialMeta], schema: pa.Schema) -> None:
        self._metas = list(metas)
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
                if not self._metas:
                    self._writer.close()
                    self._done = True
                    return self._sink.take()
                self._reader = pa.ipc.open_stream(stream_of(self._metas.pop(0)))
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                self._reader = None
                continue
            self._writer.write_batch(_conform(batch, self._schema))
            self.rows += batch.num_rows
            return self._sink.take()


__all__ = ["FastPlan", "Reencoder", "fast_plan", "schema_has_dictionaries", "unified_schema",
           "verify_files"]
