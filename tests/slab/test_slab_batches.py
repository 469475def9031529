"""The slab's index names each record batch by its bytes (docs/slab.md: per batch its time
chunk, rows, byte range and CRC32C): the daemon serves a shard as those ranges after the
stream's schema, so each range must be exactly one batch message, of its chunk and its
rows, compressed or not. Built by shuffled.slab.build, read back by Arrow alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shuffled.crc import crc32c
from shuffled.slab import build, keys, sketch
from shuffled.slab.wire import PREFIX_LEN, KeyKind, parse_prefix
from tests.helpers.slab_decode import decode
from tests.helpers.slabs import HOUR, rows_table


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_each_index_row_is_one_batch_of_its_chunk(compression: str | None) -> None:
    t = rows_table(5000, chunks=7, seed=3)
    h = np.asarray(sketch.row_hashes([t["dim"]]) >> np.uint64(32), dtype=np.uint32)
    chunk = (t["__time"].to_numpy() // HOUR) * HOUR
    order = np.lexsort((h, chunk))
    t = t.append_column(keys.KEY_COLUMN, keys.hash_keys(h)).take(pa.array(order))
    chunk = chunk[order]
    options = pa.ipc.IpcWriteOptions(compression=compression) if compression else None
    slab = build.build(t, chunk, chunk + HOUR, kind=KeyKind.HASH, sub_task_id="s",
                       slab_id=0, attempt=0, batch_rows=300, options=options)
    raw = b"".join(slab.parts())
    prefix = parse_prefix(raw[:PREFIX_LEN], max_index=1 << 30, max_stats=1 << 30,
                          max_data=1 << 40)
    stream = raw[prefix.data_at:prefix.total]  # the data section: one IPC stream
    index = decode(slab).index.to_pylist()
    assert len(index) > 7  # chunks of more than 300 rows are cut
    body = pa.BufferOutputStream()
    with pa.ipc.new_stream(body, t.schema, options=options):
        pass
    schema_message = body.getvalue().to_pybytes()[:-8]  # without the end-of-stream marker
    assert stream.startswith(schema_message)
    at = 0
    for row in index:
        piece = stream[row["offset"]: row["offset"] + row["length"]]
        assert row["offset"] == len(schema_message) + at
        at += row["length"]
        assert crc32c(piece) == row["crc32c"]
        got = pa.ipc.open_stream(pa.py_buffer(schema_message + piece)).read_all()
        assert got.num_rows == row["rows"]
        assert set((got["__time"].to_numpy() // HOUR) * HOUR) == {row["chunk_start"]}
    assert at + len(schema_message) + 8 == len(stream)


def test_the_data_section_is_the_writers_stream_byte_for_byte() -> None:
    """The uncompressed stream goes into a buffer sized by a first pass (build._stream):
    every byte of it is the writer's, none left as the allocator gave it, none short."""
    t = rows_table(3000, chunks=5, seed=8)
    t = t.set_column(t.schema.get_field_index("dim"), "dim",
                     pa.array([None if i % 7 == 0 else f"d{i % 13}" for i in range(len(t))]))
    pieces = pa.Table.from_batches([t.slice(lo, 250).to_batches()[0]
                                    for lo in range(0, len(t), 250)])
    for _ in range(3):  # reused pages from the pool hold the last stream's bytes
        got = build._stream(pieces, None)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, pieces.schema) as writer:
            writer.write_table(pieces)
        assert got.to_pybytes() == sink.getvalue().to_pybytes()
        assert pa.ipc.open_stream(got).read_all().equals(pieces)
