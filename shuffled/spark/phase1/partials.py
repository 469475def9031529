"""Phase-1 partial segments: rolled-up rows cut by (time chunk, partition).

A flush is encoded as ONE Arrow IPC stream with a record batch per partial
(:func:`encode_flush`): the schema message once, and each partial a byte range of the
stream, sent as bulk format 2 has it (:meth:`shuffled.client.ShuffleClient.put_flush`) and
stored as such by the daemon. One writer per flush, not per partial: a Druid-shaped flush
has thousands of partials of a few hundred rows, for which a writer each cost more than the
rows (and a codec context each, when compressed). :func:`split_partials` gives each partial
as a stream of its own (the same rows, the same bytes the daemon serves back).

The rows are ordered by (chunk, partition) once (usually they already are by chunk: the
rollup sorts by it, then a stable sort by the small combined key), every column is taken
into that order once (dictionary-encoded strings become plain strings in the same pass),
and each partial is a zero-copy slice of the result. A partial's bytes are exactly what
``pa.ipc.new_stream(...).write_table(slice)`` writes (tested): the schema message,
serialized once per layout, then the slice's record batch, then the end-of-stream marker.
Every partial of every task thus carries the same schema message, which the daemon's
zero-copy aggregate GET relies on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shuffled.spark.rows.rollup import BUCKET, CHUNK, Layout

SLAB = 1 << 16  # rows put in order at a time
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # IPC end-of-stream: continuation marker, length 0


CODECS = ("none", "lz4", "zstd")  # Arrow IPC buffer compression (LZ4 frame, ZSTD)
# Smaller batches go uncompressed: a compressed stream costs a writer and a codec context
# per partial (~250 us to encode and ~175 us to decode 200 rows, 5x the bytes' own cost)
# and saves little. Compression is marked per batch, so a partition may mix both.
COMPRESS_MIN_BYTES = 64 << 10


class Encoder:
    """Arrow IPC streams of record batches of one schema (its message serialized once),
    their buffers compressed with ``compression`` (``lz4``, ``zstd``) or not (``none``);
    batches under :data:`COMPRESS_MIN_BYTES` are never compressed.

    ``raw_bytes`` counts what the streams would have taken uncompressed (the schema
    message, the batches' Arrow buffers, the end marker), for the task report.
    """

    def __init__(self, schema: pa.Schema, compression: str = "none") -> None:
        if compression not in CODECS:
            raise ValueError(f"compression must be one of {CODECS}, not {compression!r}")
        self.schema = schema
        self.compression = compression
        self.head = schema.serialize().to_pybytes()
        self._options = (pa.ipc.IpcWriteOptions(compression=compression)
                         if compression != "none" else None)
        self.raw_bytes = 0

    def compresses(self, nbytes: int, batches: int) -> bool:
        """Whether a flush of ``batches`` batches holding ``nbytes`` is compressed: its
        batches average :data:`COMPRESS_MIN_BYTES` or more (one setting per stream; LZ4 on a
        200-row batch costs ~130 us, 10x its uncompressed encoding, measured)."""
        return self._options is not None and nbytes >= COMPRESS_MIN_BYTES * max(batches, 1)

    def stream(self, batches: Iterator[pa.RecordBatch], compress: bool,
               ) -> tuple[pa.Buffer, list[int]]:
        """``batches`` (consumed one at a time) as one IPC stream, compressed or not, and
        the offset where each batch ends (the first starts after the schema message,
        ``len(self.head)``)."""
        options = self._options if compress else None
        sink = pa.BufferOutputStream()
        ends = []
        with pa.ipc.new_stream(sink, self.schema, options=options) as writer:
            for batch in batches:
                self.raw_bytes += len(self.head) + len(EOS) + batch.nbytes
                writer.write_batch(batch)
                ends.append(sink.tell())
        return sink.getvalue(), ends

    def encode(self, batch: pa.RecordBatch) -> bytes:
        """One IPC stream holding ``batch`` (at least one row), as ``new_stream`` writes it
        (the schema message is the same with or without compression: only the batch's
        buffers are compressed, each marked so in its own metadata)."""
        self.raw_bytes += len(self.head) + batch.nbytes + len(EOS)
        if self._options is None or batch.nbytes < COMPRESS_MIN_BYTES:
            return b"".join((self.head, batch.serialize(), EOS))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.schema, options=self._options) as writer:
            writer.write_batch(batch)
        return sink.getvalue().to_pybytes()


def _sorted(a: np.ndarray) -> bool:
    return bool(np.all(a[1:] >= a[:-1]))


def run_order(chunks: np.ndarray, buckets: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The row order grouping rows by (chunk, bucket) (None: already grouped) and the
    start of each run in that order (plus the row count at the end)."""
    n = len(chunks)
    order: np.ndarray | None = None
    if not _sorted(chunks):
        order = np.argsort(chunks, kind="stable")
        chunks, buckets = chunks[order], buckets[order]
    rank = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(chunks[1:] != chunks[:-1], out=rank[1:])
    lo = int(buckets.min()) if n else 0
    width = (int(buckets.max()) - lo + 1) if n else 1
    key = rank * width + (buckets.astype(np.int64) - lo)
    if not _sorted(key):
        # Stable, and a radix sort when the key fits 16 bits (numpy's rule).
        small = key.astype(np.uint16) if int(key.max()) < (1 << 16) else key
        second = np.argsort(small, kind="stable")
        order = second if order is None else order[second]
        key = key[second]
    starts = np.flatnonzero(key[1:] != key[:-1]) + 1
    return order, np.concatenate([[0], starts, [n]]).astype(np.int64) if n else np.zeros(1, np.int64)


def _column(arr: pa.Array, take: pa.Array | None, lo: int, hi: int,
            typ: pa.DataType) -> pa.Array:
    """Rows ``take`` (or ``lo:hi`` when None) of ``arr`` as a plain ``typ`` array."""
    if pa.types.is_dictionary(arr.type):
        # One pass: the dictionary's values in row order (a null index gives a null).
        idx = arr.indices.slice(lo, hi - lo) if take is None else arr.indices.take(take)
        out = arr.dictionary.take(idx)
    else:
        out = arr.slice(lo, hi - lo) if take is None else arr.take(take)
    return out if out.type == typ else out.cast(typ, safe=False)


@dataclass(frozen=True)
class Flush:
    """A flush as one IPC stream: ``schema`` (its schema message, ``data[:len(schema)]``)
    and per partial (chunk, bucket, rows, offset, length) of its batch in ``data``."""

    schema: bytes
    data: pa.Buffer
    parts: list[tuple[int, int, int, int, int]]

    def bodies(self) -> Iterator[tuple[int, int, int, memoryview]]:
        """(chunk, bucket, rows, body) per partial, the body a view of :attr:`data`."""
        view = memoryview(self.data)
        for chunk, bucket, rows, offset, length in self.parts:
            yield chunk, bucket, rows, view[offset: offset + length]


def encode_flush(table: pa.Table, layout: Layout, buckets: np.ndarray | None,
                 encoder: Encoder) -> Flush:
    """Every partial of ``table`` (as :func:`runs`) as one IPC stream (see the module),
    encoded as the rows are put in order, a slab at a time: the flush holds its table and
    its encoded bytes, never a third, reordered copy."""
    keys: list[tuple[int, int, int]] = []
    plan = _plan(table, buckets)
    compress = encoder.compresses(table.nbytes, len(plan[1]) - 1)

    def batches() -> Iterator[pa.RecordBatch]:
        for chunk, bucket, batch in _runs(table, layout, plan):
            keys.append((chunk, bucket, batch.num_rows))
            yield batch

    data, ends = encoder.stream(batches(), compress)
    head = len(encoder.head)
    starts = [head, *ends[:-1]]
    parts = [(chunk, bucket, rows, at, end - at)
             for (chunk, bucket, rows), at, end in zip(keys, starts, ends, strict=True)]
    return Flush(data[:head].to_pybytes() if keys else encoder.head, data, parts)


def split_partials(table: pa.Table, layout: Layout, buckets: np.ndarray | None = None,
                   encoder: Encoder | None = None) -> Iterator[tuple[int, int, int, bytes]]:
    """``(chunk, bucket, rows, ipc_bytes)`` for each (chunk, bucket) present in ``table``,
    each partial a stream of its own, lazily (see :func:`runs`)."""
    schema = layout.schema()
    enc = (encoder if encoder is not None and encoder.schema.equals(schema)
           else Encoder(schema, encoder.compression if encoder is not None else "none"))
    for chunk, bucket, batch in runs(table, layout, buckets):
        yield chunk, bucket, batch.num_rows, enc.encode(batch)


def runs(table: pa.Table, layout: Layout, buckets: np.ndarray | None = None,
         ) -> Iterator[tuple[int, int, pa.RecordBatch]]:
    """``(chunk, bucket, rows)`` for each (chunk, bucket) present in ``table`` (rolled-up
    rows with ``__chunk``, the layout's columns and, unless ``buckets`` gives them,
    ``__bucket``), in (chunk, bucket) order, the rows a zero-copy slice of a batch in the
    layout's schema; lazily. Columns are put in order a slab of about :data:`SLAB` rows at
    a time."""
    if table.num_rows:
        yield from _runs(table, layout, _plan(table, buckets))


Plan = tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]


def _plan(table: pa.Table, buckets: np.ndarray | None) -> Plan:
    """The row order, run starts, chunks and buckets of :func:`run_order` (no runs for
    an empty table)."""
    if table.num_rows == 0:
        empty = np.zeros(0, np.int64)
        return None, np.zeros(1, np.int64), empty, empty
    chunks = table.column(CHUNK).to_numpy()
    bucket_of = np.asarray(buckets if buckets is not None else table.column(BUCKET).to_numpy())
    order, starts = run_order(chunks, bucket_of)
    return order, starts, chunks, bucket_of


def _runs(table: pa.Table, layout: Layout, plan: Plan,
          ) -> Iterator[tuple[int, int, pa.RecordBatch]]:
    order, starts, chunks, bucket_of = plan
    if len(starts) < 2:
        return
    schema = layout.schema()
    columns = [table.column(f.name).combine_chunks() for f in schema]
    firsts = starts[:-1] if order is None else order[starts[:-1]]
    run_chunks, run_buckets = chunks[firsts].tolist(), bucket_of[firsts].tolist()
    bounds = starts.tolist()
    runs, i = len(bounds) - 1, 0
    while i < runs:
        lo = bounds[i]
        j = min(max(int(np.searchsorted(starts, lo + SLAB)), i + 1), runs)
        hi = bounds[j]
        take = None if order is None else pa.array(order[lo:hi])
        batch = pa.RecordBatch.from_arrays(
            [_column(c, take, lo, hi, f.type) for c, f in zip(columns, schema)], schema=schema)
        for r in range(i, j):
            n = bounds[r + 1] - bounds[r]
            yield int(run_chunks[r]), int(run_buckets[r]), batch.slice(bounds[r] - lo, n)
        i = j
