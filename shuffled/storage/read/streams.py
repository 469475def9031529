"""A stored partial as the Arrow IPC stream it was uploaded as, and partitions as one stream.

Storage format 3 keeps a partial in two ranges of its pack (:class:`~shuffled.storage.ondisk.records.PartialMeta`):
its schema message and its body; the end-of-stream marker is implied. This module turns
those ranges into what readers get, without decoding where it can:

- :func:`stream_pieces` and :func:`byte_range`: one partial, whole or a ``Range`` of it;
- :func:`fast_plan`: the seed's aggregate of a partition as ONE stream (one schema message,
  every body, one end marker), zero-copy, with adjacent bodies (a partition's partials
  uploaded together) coalesced into one range: one ``sendfile`` where there were hundreds;
- :func:`verify`, :func:`unified_schema` and :class:`Reencoder`: the slow path, when the
  partials' schemas differ or hold dictionaries;
- :func:`messages`: a partial's IPC messages with their ranges, for paged reads.

Pieces are ``(offset, length)`` ranges of the pack file, or ``bytes`` to send as they are.
"""

from __future__ import annotations

import io
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

import pyarrow as pa

from shuffled.crc import combine, combine_all, crc32c
from shuffled.errors import Conflict, CorruptData
from shuffled.protocol import crc_hex
from shuffled.storage.ondisk.arrowfile import EOS, EOS_CRC
from shuffled.storage.ondisk.records import PartialMeta

VERIFY_CHUNK = 1 << 20
Range = tuple[int, int] | bytes  # (offset, length) in the pack, or literal bytes


def stream_pieces(meta: PartialMeta) -> list[Range]:
    """The partial's whole stream: schema message, body, end-of-stream marker."""
    return [(meta.schema_at, meta.schema_len), (meta.offset, meta.body_len), EOS]


def byte_range(meta: PartialMeta, start: int, count: int) -> list[Range]:
    """Bytes ``[start, start + count)`` of the partial's stream, as pieces (RFC 9110
    section 14: a Range of the representation, which is the whole stream)."""
    out: list[Range] = []
    at = 0
    for piece in stream_pieces(meta):
        length = len(piece) if isinstance(piece, bytes) else piece[1]
        lo, hi = max(start, at), min(start + count, at + length)
        if lo < hi:
            if isinstance(piece, bytes):
                out.append(piece[lo - at: hi - at])
            else:
                out.append((piece[0] + lo - at, hi - lo))
        at += length
    return out


class Piece(NamedTuple):
    """One byte range of a plan (a tuple: one is built per partial served)."""

    file: int  # index into the partials (and their opened packs)
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class FastPlan:
    """The zero-copy aggregate: ``pieces`` then the end-of-stream marker (in ``length``)."""

    pieces: list[Piece]
    length: int
    crc: int
    rows: int


def fast_plan(metas: Sequence[PartialMeta]) -> FastPlan | None:
    """The zero-copy plan, or None when the slow path is needed (schemas differ, or
    dictionaries: a later partial's dictionaries would not apply to the first's schema)."""
    first = metas[0]
    if any(m.has_dictionaries or m.schema_crc != first.schema_crc
           or m.schema_len != first.schema_len for m in metas):
        return None
    pieces = [Piece(0, first.schema_at, first.schema_len)]
    lengths = [m.body_len for m in metas]
    # The current run of adjacent bodies (same pack file, each starting where the last
    # ended), kept in locals: this loop runs once per partial of every aggregate GET.
    run_file, run_at, run_end, run_path = -1, 0, -1, None
    for i, meta in enumerate(metas):
        body_len = lengths[i]
        path = meta.path
        if run_end == meta.offset and (path is run_path or path == run_path):
            run_end += body_len
        else:
            if run_file >= 0:
                pieces.append(Piece(run_file, run_at, run_end - run_at))
            run_file, run_at, run_end, run_path = i, meta.offset, meta.offset + body_len, path
    if run_file >= 0:
        pieces.append(Piece(run_file, run_at, run_end - run_at))
    # The stream's CRC from the stored ones, all bodies at once (a combine per partial
    # was 909 of 4,970 samples of an aggregate GET of 1,000 partials).
    crc = combine_all(first.schema_crc, [m.body_crc for m in metas], lengths)
    return FastPlan(pieces, first.schema_len + sum(lengths) + len(EOS),
                    combine(crc, EOS_CRC, len(EOS)), sum(m.rows for m in metas))


def crc_of(fd: int, offset: int, length: int, crc: int = 0) -> tuple[int, int]:
    """CRC32C of ``length`` bytes of ``fd`` at ``offset`` (continuing ``crc``), read in
    chunks; also how many bytes there were."""
    done = 0
    while done < length:
        chunk = os.pread(fd, min(VERIFY_CHUNK, length - done), offset + done)
        if not chunk:
            break
        crc = crc32c(chunk, crc)
        done += len(chunk)
    return crc, done


def verify(files: Sequence[IO[bytes]], metas: Sequence[PartialMeta]) -> None:
    """Check each partial's stream against the CRC32C stored at upload; CorruptData naming
    it if one differs. The slow path needs this: a re-encoded stream carries no digest the
    reader could check, so damage on disk would otherwise reach a segment unnoticed."""
    for fh, meta in zip(files, metas, strict=True):
        crc, got = crc_of(fh.fileno(), meta.schema_at, meta.schema_len)
        crc, more = crc_of(fh.fileno(), meta.offset, meta.body_len, crc)
        crc = crc32c(EOS, crc)
        if got + more != meta.size - len(EOS) or crc != meta.crc:
            raise CorruptData(
                f"partial segment {meta.key} is corrupt on disk: CRC32C {crc_hex(crc)}, "
                f"stored at upload {crc_hex(meta.crc)}; re-run the subtask that wrote it",
                key=str(meta.key), supervisorTaskId=meta.key.supervisor_task_id,
                subTaskId=meta.key.sub_task_id, partitionId=meta.key.partition_id,
            )


class _Stitched(io.RawIOBase):
    """The partial's stream as one read-only file over a memory map of its pack (for
    pyarrow's readers; nothing is copied into the heap but what is read)."""

    def __init__(self, meta: PartialMeta) -> None:
        super().__init__()
        with open(meta.path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(self._map)
        self._parts = [view[meta.schema_at: meta.schema_at + meta.schema_len],
                       view[meta.offset: meta.offset + meta.body_len], memoryview(EOS)]
        self._size = meta.size
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._at, 2: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        done, at = 0, 0
        for part in self._parts:
            if done == len(out):
                break
            lo = self._at + done - at
            if 0 <= lo < len(part):
                n = min(len(part) - lo, len(out) - done)
                out[done: done + n] = part[lo: lo + n]
                done += n
            at += len(part)
        self._at += done
        return done

    def close(self) -> None:
        if not self.closed:
            self._parts = []
            try:
                self._map.close()
            except BufferError:
                pass  # a buffer of it is still exported: unmapped when that is released
        super().close()


def stream_of(meta: PartialMeta) -> pa.NativeFile:
    """The partial's stream, readable by ``pa.ipc.open_stream``."""
    return pa.PythonFile(io.BufferedReader(_Stitched(meta), 1 << 20), mode="r")


def unified_schema(files: Sequence[IO[bytes]], metas: Sequence[PartialMeta]) -> pa.Schema:
    """Verify each partial (:func:`verify`), read each stream's schema and unify them;
    409 naming the subtasks if impossible."""
    verify(files, metas)
    schemas = []
    for fh, meta in zip(files, metas, strict=True):
        head = os.pread(fh.fileno(), meta.schema_len, meta.schema_at)
        schemas.append(pa.ipc.read_schema(pa.py_buffer(head)))
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        subs = [m.key.sub_task_id for m in metas]
        raise Conflict(
            f"partial segments of this partition have schemas that cannot be unified "
            f"({exc}); fetch them one by one with the per-subtask GET",
            subTaskIds=subs[:50],
        ) from exc


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


#: Rows re-encoded at a time: a batch is conformed to the unified schema in slices, so a
#: column filled with nulls or cast costs at most this many rows of it, whatever a batch
#: declares (an int64 column: 512 KiB).
SLICE_ROWS = 1 << 16


class Reencoder:
    """Re-encodes several partials into one stream with ``schema``, at most
    :data:`SLICE_ROWS` rows per :meth:`next`. Every method blocks; the handler calls them
    on the I/O threads."""

    def __init__(self, metas: Sequence[PartialMeta], schema: pa.Schema) -> None:
        self._metas = list(metas)
        self._schema = schema
        self._sink = _ChunkSink()
        self._writer = pa.ipc.new_stream(self._sink, schema)
        self._reader: pa.ipc.RecordBatchStreamReader | None = None
        self._source: pa.NativeFile | None = None
        self._batch: pa.RecordBatch | None = None
        self._at = 0
        self._done = False
        self.rows = 0

    def next(self) -> bytes | None:
        """The next piece of the output stream, or None after the end-of-stream marker."""
        if self._done:
            return None
        while True:
            if self._batch is not None:
                piece = self._batch.slice(self._at, SLICE_ROWS)
                self._at += SLICE_ROWS
                if self._at >= self._batch.num_rows:
                    self._batch = None
                self._writer.write_batch(_conform(piece, self._schema))
                self.rows += piece.num_rows
                return self._sink.take()
            if self._reader is None:
                if not self._metas:
                    self._writer.close()
                    self._done = True
                    return self._sink.take()
                self._source = stream_of(self._metas.pop(0))
                self._reader = pa.ipc.open_stream(self._source)
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                self._reader = None
                if self._source is not None:
                    self._source.close()
                continue
            self._batch, self._at = batch, 0
            if not batch.num_rows:
                self._batch = None
                self._writer.write_batch(_conform(batch, self._schema))
                return self._sink.take()


@dataclass(frozen=True, slots=True)
class Message:
    kind: str  # "schema", "dictionary" or "record batch"
    offset: int  # in the pack
    length: int


def messages(meta: PartialMeta) -> list[Message]:
    """The IPC messages of one partial, with their byte ranges in its pack: its schema
    message, then those of its body."""
    out = [Message("schema", meta.schema_at, meta.schema_len)]
    with pa.memory_map(str(meta.path), "r") as source:
        source.seek(meta.offset)
        reader = pa.BufferReader(source.read_buffer(meta.body_len))
        while (at := reader.tell()) < meta.body_len:
            message = pa.ipc.read_message(reader)
            out.append(Message(message.type, meta.offset + at, reader.tell() - at))
    return out
