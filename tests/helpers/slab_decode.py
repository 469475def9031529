"""Slabs built in a test, decoded back (the format's own checks, shuffled.slab.wire), and
the rows a shard of them holds: what a daemon's read of [key_from, key_to) answers."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from shuffled.slab.build import Slab
from shuffled.slab.keys import KEY_COLUMN
from shuffled.slab.sketch import STATS_SCHEMA
from shuffled.slab.wire import INDEX_SCHEMA, PREFIX_LEN, check_index, parse_header, \
    parse_prefix, read_ipc


@dataclass(frozen=True)
class Decoded:
    index: pa.Table
    stats: pa.Table
    data: pa.Table  # the rows, __key included


def decode(slab: Slab) -> Decoded:
    raw = b"".join(slab.parts())
    prefix = parse_prefix(raw[:PREFIX_LEN], max_index=1 << 30, max_stats=1 << 30,
                          max_data=1 << 40)
    header = parse_header(prefix, raw[PREFIX_LEN:prefix.sections_at])
    at = prefix.sections_at
    index = read_ipc(raw[at:at + prefix.index_len], INDEX_SCHEMA, "index")
    check_index(index, header, prefix)
    at += prefix.index_len
    stats = read_ipc(raw[at:at + prefix.stats_len], STATS_SCHEMA, "statistics")
    data = pa.ipc.open_stream(pa.py_buffer(raw[prefix.data_at:prefix.total])).read_all()
    return Decoded(index, stats, data)


def shard_rows(data: pa.Table, chunk: int, chunk_column: pa.Array,
               key_from: bytes | None, key_to: bytes | None) -> pa.Table:
    """The rows of ``data`` in ``chunk`` with ``__key`` in [key_from, key_to)."""
    mask = pc.equal(chunk_column, chunk)
    keys = data.column(KEY_COLUMN)
    if key_from is not None:
        mask = pc.and_(mask, pc.greater_equal(keys, pa.scalar(key_from, pa.binary())))
    if key_to is not None:
        mask = pc.and_(mask, pc.less(keys, pa.scalar(key_to, pa.binary())))
    return data.filter(mask)
