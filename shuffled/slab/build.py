"""A flush's rows, sorted by (time chunk, key), cut into a slab (the writer's side).

Batches never span two chunks and hold at most ``batch_rows`` rows, so that a shard chosen
after phase 1 starts and ends inside at most one batch per slab at each edge (the daemon
trims those). The data section is written by pyarrow's stream writer; a batch's offset is
where the writer's sink stood before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shuffled.crc import crc32c
from shuffled.slab import sketch
from shuffled.slab.keys import KEY_COLUMN
from shuffled.slab.wire import INDEX_SCHEMA, KeyKind, SlabHeader, encode_prefix

BATCH_ROWS = 4096


@dataclass(frozen=True)
class Slab:
    """One slab's bytes in pieces (sent back to back), and what the writer reports."""

    head: bytes  # prefix and header
    index: bytes
    stats: bytes
    data: pa.Buffer  # as the IPC writer left it: a copy to bytes cost a memcpy of the flush
    rows: int
    chunks: int
    # The statistics' HLL registers as the writer made them (chunks x 2^11; None: not
    # sketched), for the writer's own report: decoding them back from ``stats`` was ~a
    # tenth of a determining spec's slab upload.
    registers: np.ndarray | None = None

    def parts(self) -> list[bytes | pa.Buffer]:
        return [self.head, self.index, self.stats, self.data]

    @property
    def size(self) -> int:
        return len(self.head) + len(self.index) + len(self.stats) + self.data.size


def _key_bounds(keys: pa.Array | None, starts: np.ndarray, ends: np.ndarray,
                ) -> tuple[pa.Array, pa.Array]:
    """Each batch's first and last key (empty without keys), two takes."""
    if keys is None or not len(starts):
        empty = pa.array(np.zeros(len(starts) + 1, np.int32))
        blank = pa.Array.from_buffers(pa.binary(), len(starts), [None, empty.buffers()[1],
                                                                  pa.py_buffer(b"")])
        return blank, blank
    keys = keys.cast(pa.binary())
    return (keys.take(pa.array(starts.astype(np.int64))),
            keys.take(pa.array(ends.astype(np.int64) - 1)))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _stream(table: pa.Table, options: pa.ipc.IpcWriteOptions | None) -> pa.Buffer:
    """``table``'s batches as one IPC stream. Uncompressed, into a buffer of its exact size,
    measured by a first pass that copies nothing: the writer's growing buffer copied a
    42 MB slab's bytes once more on its way to 64 MiB, in fresh pages each time (a slab's
    write 10-270 ms -> 10-160; docs/benchmarks.md). Compressed, the size is not known
    without compressing twice."""
    if options is not None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        return sink.getvalue()
    measure = pa.MockOutputStream()
    with pa.ipc.new_stream(measure, table.schema) as writer:
        writer.write_table(table)
    body = pa.allocate_buffer(measure.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(body), table.schema) as writer:
        writer.write_table(table)
    return body


def _messages(body: pa.Buffer, schema_len: int) -> tuple[list[int], list[int]]:
    """The byte offset and length of each record batch message of an IPC stream that
    starts with its ``schema_len``-byte schema message (each message: 8 bytes of prefix,
    its metadata padded as written, its body)."""
    offsets: list[int] = []
    lengths: list[int] = []
    at = schema_len
    reader = pa.ipc.MessageReader.open_stream(body)
    reader.read_next_message()  # the schema
    for message in reader:
        size = 8 + message.metadata.size + message.body.size
        offsets.append(at)
        lengths.append(size)
        at += size
    if at != body.size - 8:  # the end-of-stream marker
        raise AssertionError(f"the stream's messages end at {at}, not {body.size - 8}")
    return offsets, lengths


def chunk_bounds(chunk_start: np.ndarray) -> np.ndarray:
    """Row offsets where each run of equal ``chunk_start`` begins, and the row count."""
    if not len(chunk_start):
        return np.zeros(1, dtype=np.int64)
    change = np.flatnonzero(chunk_start[1:] != chunk_start[:-1]) + 1
    return np.concatenate([[0], change, [len(chunk_start)]]).astype(np.int64)


def batch_starts(bounds: np.ndarray, batch_rows: int = BATCH_ROWS,
                 partition: np.ndarray | None = None) -> np.ndarray:
    """Where each record batch of a slab begins, its chunks at ``bounds``
    (:func:`chunk_bounds`): every chunk boundary, every ``batch_rows`` inside a chunk,
    every change of ``partition``."""
    cuts = [np.arange(lo, hi, batch_rows) for lo, hi in zip(bounds[:-1], bounds[1:],
                                                            strict=True)]
    starts = np.concatenate(cuts) if cuts else np.zeros(0, np.int64)
    if partition is not None and len(partition):
        change = np.flatnonzero(partition[1:] != partition[:-1]) + 1
        starts = np.union1d(starts, change)
    return starts


def build(table: pa.Table, chunk_start: np.ndarray, chunk_end: np.ndarray, *,
          kind: KeyKind, sub_task_id: str, slab_id: int, attempt: int,
          rollup_hashes: np.ndarray | None = None, batch_rows: int = BATCH_ROWS,
          partition: np.ndarray | None = None,
          options: pa.ipc.IpcWriteOptions | None = None) -> Slab:
    """Cut ``table`` (sorted by chunk, then by its ``__key`` column unless ``kind`` is
    NONE) into a slab. ``chunk_start``/``chunk_end`` give each row's time chunk (ms);
    ``rollup_hashes`` a 64-bit hash of each row's rolled-up key (:func:`.sketch.row_hashes`)
    for the statistics; ``partition`` each row's shard when it is known up front."""
    if kind != KeyKind.NONE and KEY_COLUMN not in table.column_names:
        raise ValueError(f"a keyed slab needs its {KEY_COLUMN} column")
    if any(pa.types.is_dictionary(f.type) for f in table.schema):
        raise ValueError("slab version 1 carries no dictionary-encoded columns: decode them")
    chunk_start = np.asarray(chunk_start, dtype=np.int64)
    chunk_end = np.asarray(chunk_end, dtype=np.int64)
    bounds = chunk_bounds(chunk_start)
    starts = batch_starts(bounds, batch_rows, partition)
    ends = np.append(starts[1:], table.num_rows).astype(np.int64)
    keys = table.column(KEY_COLUMN).combine_chunks() if kind != KeyKind.NONE else None
    schema_len = table.schema.serialize().size  # the writer puts it before the first batch
    whole = table.combine_chunks().to_batches()
    # One call writes every batch (a batch a chunk: thousands a slab); a Python write_batch
    # and tell() per batch was a quarter of a phase-1 slab's upload.
    body = _stream(pa.Table.from_batches(
        [whole[0].slice(lo, n) for lo, n in zip(starts.tolist(), (ends - starts).tolist(),
                                                strict=True)],
        table.schema), options)
    offsets, lengths = _messages(body, schema_len)
    if len(offsets) != len(starts):
        raise AssertionError(f"the stream holds {len(offsets)} batches, not {len(starts)}")
    view = memoryview(body)
    if bytes(view[:schema_len]) != table.schema.serialize().to_pybytes():
        raise AssertionError("the stream does not start with the schema message expected")
    crcs = [crc32c(view[o: o + n]) for o, n in zip(offsets, lengths, strict=True)]
    rows = (ends - starts).astype(np.int64)
    index = pa.table([
        pa.array(chunk_start[starts] if len(starts) else [], pa.int64()),
        pa.array(chunk_end[starts] if len(starts) else [], pa.int64()),
        *_key_bounds(keys, starts, ends),
        pa.array(rows, pa.int64()), pa.array(offsets, pa.int64()),
        pa.array(lengths, pa.int64()), pa.array(crcs, pa.uint32()),
        pa.array(partition[starts] if partition is not None and len(starts)
                 else np.full(len(starts), -1), pa.int32()),
    ], schema=INDEX_SCHEMA)
    firsts = bounds[:-1]
    # Without the hashes, no sketch: every chunk's registers empty (what a chunk of no
    # rows would encode to), and no loop over chunks to say so.
    regs = sketch.registers(rollup_hashes, bounds) if rollup_hashes is not None else None
    hll = (pa.array([sketch.encode_registers(r) for r in regs], pa.binary())
           if regs is not None else
           pa.Array.from_buffers(pa.binary(), len(firsts), [
               None, pa.py_buffer(np.zeros(len(firsts) + 1, np.int32)), pa.py_buffer(b"")]))
    # The format's per-chunk key sample is written empty: the plan samples distinct
    # rolled-up rows from the task's report (docs/slab.md, "Range bounds from a sample of
    # distinct rows"), and nothing read this one. Its keys were ~30% of a range spec's
    # bytes shuffled (comparison 12: 452 MB against numShards' 317).
    picks = pa.ListArray.from_arrays(pa.array(np.zeros(len(firsts) + 1, np.int32)),
                                     pa.array([], pa.binary()))
    stats = pa.table([
        pa.array(chunk_start[firsts] if len(firsts) else [], pa.int64()),
        pa.array(chunk_end[firsts] if len(firsts) else [], pa.int64()),
        pa.array(np.diff(bounds), pa.int64()),
        hll,
        picks,
    ], schema=sketch.STATS_SCHEMA)
    index_bytes, stats_bytes = _ipc(index), _ipc(stats)
    header = SlabHeader(sub_task_id, slab_id, attempt, table.num_rows, crc32c(index_bytes),
                        crc32c(stats_bytes), crc32c(view))
    head = encode_prefix(kind, header, len(index_bytes), len(stats_bytes), body.size)
    return Slab(head, index_bytes, stats_bytes, body, table.num_rows, len(firsts), regs)
