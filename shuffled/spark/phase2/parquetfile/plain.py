"""Small segments' Parquet files, encoded a batch at a time: one row group, one PLAIN data
page a column, the footer pyarrow would write.

Why: a segment of a few hundred rows cost ~0.19 ms of pyarrow a file (0.25 within a run:
the writer's properties, schema conversion, column writers and Thrift objects made and
freed for each; ~0.13 ms with every option off), the largest single cost of a day-chunked
ingestion's phase 2 (7,304 files in comparison 7). Here the per-column work is done once
for the whole batch (each column's PLAIN bytes and where each file's begin, null counts,
minimums and maximums: numpy passes, a take, one hash aggregation), and a file is its
slices, one compression call a column and a footer put together from pieces made once per
schema: ~0.13 ms a file of comparison 7's shape, a third of it the compression.

What is written is what ``pq.write_table(table, compression=codecs,
use_dictionary=False)`` writes (Parquet format 2.6, data page v1), field for field: the
schema, the ``ARROW:schema`` key and ``created_by`` are copied from pyarrow's own footer for
the schema; the statistics (with the exactness flags), the size statistics and the
encoding stats are those pyarrow writes. Only the definition levels' runs may be spelled
differently (a bit-packed run where pyarrow may mix runs), which no reader sees.
``tests/spark/phase2/test_parquetfile.py`` holds pyarrow's writer (26) as the
reference, and reads the files back with pyarrow and DuckDB.

Only what is common and plain is encoded here: int64, ``timestamp[ms]`` and string columns,
codecs none/lz4/zstd, 1 to :data:`MAX_ROWS` rows, strings under pyarrow's statistics
size limit. :meth:`PlainFiles.encode` answers None for any other table, and the caller
writes it with pyarrow.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shuffled.spark.phase2.parquetfile.thrift import (
    BINARY, I32, I64, STRUCT, STOP, binary, list_header, read_struct, uvarint, zigzag,
)

MAGIC = b"PAR1"
#: A segment of at most this many rows is written without dictionary pages (here, or by
#: pyarrow for a schema not encoded here): a dictionary per column is a fixed cost that
#: saves no bytes on so few values (410 rows of the Druid shape: 10.7 against 10.5 KB, 25%
#: less encoding time; at 1,000 rows 12% more bytes).
MAX_ROWS = 512
#: parquet-cpp leaves out a column's min/max past this many bytes (WriterProperties'
#: max_statistics_size); such a table is left to pyarrow.
MAX_STAT_BYTES = 4096

# Parquet's enums (parquet.thrift).
_INT64, _BYTE_ARRAY = 2, 6
_PLAIN, _RLE = 0, 3
# The segments' codecs (spec.model.SEGMENT_CODECS's values): pyarrow's "lz4" is LZ4_RAW.
_CODECS = {"none": 0, "zstd": 6, "lz4": 7}
_ARROW_CODECS = {"zstd": "zstd", "lz4": "lz4_raw"}
_I64_LIMITS = (np.iinfo(np.int64).max, np.iinfo(np.int64).min)


@dataclass(frozen=True)
class _Column:
    """A column's constant pieces: everything of its page header and metadata that does
    not depend on the rows."""

    strings: bool
    optional: bool
    codec: pa.Codec | None
    meta_head: bytes  # ColumnChunk up to total_uncompressed_size's header
    size_head: bytes  # the size statistics' header, or b"" (a required int64 has none)


class PlainFiles:
    """The encoder for one schema and its columns' codecs (make it with :meth:`of`)."""

    def __init__(self, schema: pa.Schema, columns: list[_Column], prefix: bytes,
                 suffix: bytes) -> None:
        self.schema = schema
        self.columns = columns
        self.prefix, self.suffix = prefix, suffix

    @classmethod
    def of(cls, schema: pa.Schema, codecs: dict[str, str]) -> PlainFiles | None:
        """The encoder for ``schema``, None when one of its columns or codecs is not
        encoded here."""
        return _encoder(schema, tuple(codecs.get(n, "none") for n in schema.names))

    def encode(self, tables: Sequence[pa.Table]) -> list[bytes | None]:
        """Each table's Parquet file, or None for one not encoded here (another schema,
        0 or over :data:`MAX_ROWS` rows; every one of them when a string of the batch
        is past :data:`MAX_STAT_BYTES`)."""
        out: list[bytes | None] = [None] * len(tables)
        todo = [n for n, t in enumerate(tables)
                if 0 < t.num_rows <= MAX_ROWS
                and t.schema.equals(self.schema, check_metadata=True)]
        if not todo:
            return out
        rows = np.array([tables[n].num_rows for n in todo], np.int64)
        bounds = np.concatenate([[0], np.cumsum(rows)])
        firsts = bounds[:-1].tolist()
        whole = pa.concat_tables([tables[n] for n in todo])
        columns = []
        for spec, col in zip(self.columns, whole.columns, strict=True):
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            prepared = _strings(arr, bounds) if spec.strings else _ints(arr, bounds)
            if prepared is None:
                return out
            columns.append(prepared)
        strings = [n for n, spec in enumerate(self.columns) if spec.strings]
        if strings:
            limits = _string_limits(whole.select(strings), rows)
            for n, (lows, highs) in zip(strings, limits, strict=True):
                columns[n].lows, columns[n].highs = lows, highs
        for n, data in zip(todo, self._files(rows.tolist(), firsts, columns), strict=True):
            out[n] = data
        return out

    def _files(self, rows: list[int], firsts: list[int], columns: list[_Prepared],
               ) -> list[bytes]:
        """The files (``firsts``: each one's first row in the batch), a column at a time
        over them all (list comprehensions: a file at a time, the interpreter's
        per-statement cost was most of it)."""
        count = len(rows)
        at = [len(MAGIC)] * count
        total_u = [0] * count
        total_c = [0] * count
        parts: list[list[bytes]] = [[MAGIC] for _ in range(count)]
        chunks: list[list[bytes]] = [[] for _ in range(count)]
        z = zigzag
        for spec, p in zip(self.columns, columns, strict=True):
            whole = p.plain.tobytes()
            ends = p.starts
            bodies = [whole[ends[i]:ends[i + 1]] for i in range(count)]
            if spec.optional:
                bodies = [_levels(p.valid, a, n, k) + body for a, n, k, body in
                          zip(firsts, rows, p.nulls, bodies, strict=True)]
            compress = spec.codec.compress if spec.codec else None
            datas = [compress(b, asbytes=True) for b in bodies] if compress else bodies
            stats = [_stats(spec.strings, k, n, lo, hi) for k, n, lo, hi in
                     zip(p.nulls, rows, p.lows, p.highs, strict=True)]
            # PageHeader: type DATA_PAGE, uncompressed and compressed sizes, then its
            # DataPageHeader: the value count, PLAIN, RLE levels, the statistics.
            headers = [b"".join((b"\x15\x00\x15", z(len(body)), b"\x15", z(len(data)),
                                 b"\x2c\x15", z(n), b"\x15\x00\x15\x06\x15\x06\x1c", st,
                                 b"\x00\x00"))
                       for body, data, n, st in zip(bodies, datas, rows, stats, strict=True)]
            sizes = _size_stats(spec, p, rows)
            for i in range(count):
                h, body, data = headers[i], bodies[i], datas[i]
                usize = len(h) + len(body)
                csize = len(h) + len(data)
                parts[i] += (h, data)
                # ColumnMetaData from num_values on: the sizes, data_page_offset (9),
                # statistics (12), encoding_stats (13), size_statistics (16).
                chunks[i].append(b"".join((
                    spec.meta_head, z(rows[i]), b"\x16", z(usize), b"\x16", z(csize),
                    b"\x26", z(at[i]), b"\x3c", stats[i], _ENCODING_STATS, sizes[i],
                    b"\x00\x00")))
                at[i] += csize
                total_u[i] += usize
                total_c[i] += csize
        head = self.prefix + b"\x16"
        columns_head = b"\x19" + list_header(1, STRUCT) + b"\x19" + list_header(
            len(self.columns), STRUCT)
        out = []
        for i in range(count):
            n = rows[i]
            # FileMetaData: version and schema (the prefix), num_rows, one RowGroup (its
            # columns, total_byte_size, num_rows, file_offset, total_compressed_size),
            # then key_value_metadata, created_by and column_orders (the suffix).
            footer = b"".join((
                head, z(n), columns_head, *chunks[i], b"\x16", z(total_u[i]), b"\x16", z(n),
                b"\x26", z(len(MAGIC)), b"\x16", z(total_c[i]), STOP, self.suffix))
            out.append(b"".join((*parts[i], footer, struct.pack("<I", len(footer)), MAGIC)))
        return out


def _size_stats(spec: _Column, p: _Prepared, rows: list[int]) -> list[bytes]:
    """Each file's SizeStatistics field of the column (b"": none, a required int64): the
    values' bytes for strings, an empty repetition histogram, the definition levels'
    histogram (empty for a required column)."""
    if not spec.size_head:
        return [b""] * len(rows)
    empty = list_header(0, I64)
    if spec.optional:
        hists = [b"".join((list_header(2, I64), zigzag(k), zigzag(n - k)))
                 for k, n in zip(p.nulls, rows, strict=True)]
    else:
        hists = [empty] * len(rows)
    if spec.strings and p.unencoded is not None:
        return [b"".join((spec.size_head, b"\x16", zigzag(u), b"\x19", empty, b"\x19", h,
                          STOP)) for u, h in zip(p.unencoded, hists, strict=True)]
    return [b"".join((spec.size_head, b"\x29", empty, b"\x19", h, STOP)) for h in hists]


def _stats(strings: bool, nulls: int, n: int, lo: bytes, hi: bytes) -> bytes:
    """A Statistics struct's fields and stop: pyarrow writes the deprecated min/max too for
    signed integers, and no min/max at all for a column without values."""
    if nulls == n:
        return b"\x36" + zigzag(nulls) + STOP
    if strings:
        return b"".join((b"\x36", zigzag(nulls), b"\x28", binary(hi), b"\x18", binary(lo),
                         b"\x11\x11\x00"))
    return b"".join((b"\x18\x08", hi, b"\x18\x08", lo, b"\x16", zigzag(nulls),
                     b"\x28\x08", hi, b"\x18\x08", lo, b"\x11\x11\x00"))


# encoding_stats: one PLAIN data page (PageEncodingStats: page_type 0, encoding 0, count 1)
_ENCODING_STATS = b"\x19" + list_header(1, STRUCT) + b"\x15\x00\x15\x00\x15\x02\x00"


@dataclass
class _Prepared:
    """A column of a batch made ready: its PLAIN bytes and where each file's begin, its
    validity (None: no nulls), and per file its null count, minimum and maximum (as the
    statistics hold them: 8 little-endian bytes, or the string's bytes) and, for strings,
    its values' bytes."""

    plain: np.ndarray
    starts: list[int]  # per file, where its values begin in plain (one more: the end)
    valid: np.ndarray | None
    nulls: list[int]
    lows: list[bytes]
    highs: list[bytes]
    unencoded: list[int] | None = None


def _ints(arr: pa.Array, bounds: np.ndarray) -> _Prepared:
    n = len(arr)
    values = np.frombuffer(arr.buffers()[1], np.int64, n, arr.offset)
    valid = _validity(arr)
    starts = bounds[:-1]
    if valid is None:
        plain, at, nulls = values, bounds, np.zeros(len(starts), np.int64)
        lows = np.minimum.reduceat(values, starts)
        highs = np.maximum.reduceat(values, starts)
    else:
        plain = values[valid]
        at = np.concatenate([[0], np.cumsum(valid, dtype=np.int64)])[bounds]
        nulls = np.diff(bounds) - np.diff(at)
        lows = np.minimum.reduceat(np.where(valid, values, _I64_LIMITS[0]), starts)
        highs = np.maximum.reduceat(np.where(valid, values, _I64_LIMITS[1]), starts)
    lo = lows.astype("<i8").tobytes()
    hi = highs.astype("<i8").tobytes()
    return _Prepared(plain.view(np.uint8).reshape(-1), (at * 8).tolist(), valid,
                     nulls.tolist(), [lo[k:k + 8] for k in range(0, len(lo), 8)],
                     [hi[k:k + 8] for k in range(0, len(hi), 8)])


def _strings(arr: pa.Array, bounds: np.ndarray) -> _Prepared | None:
    """The PLAIN encoding of a string column (each value its 4-byte little-endian length,
    then its bytes; nulls left out) for a whole batch, with each file's null count and
    values' bytes (its minimum and maximum come from :func:`_string_limits`); None when a
    value is too long for pyarrow's statistics."""
    n = len(arr)
    raw = arr.view(pa.binary())
    valid = _validity(arr)
    offsets = np.frombuffer(raw.buffers()[1], np.int32, n + 1, raw.offset)
    lens = np.diff(offsets)
    if valid is not None:
        lens = np.where(valid, lens, 0)
    if int(lens.max(initial=0)) >= MAX_STAT_BYTES:
        return None
    # Each length before its value: the lengths and the values interleaved by one take
    # (a binary take copies each value's bytes in order; a null takes no bytes). An
    # element-wise join took twice as long, numpy's insert four times.
    heads = pa.Array.from_buffers(pa.binary(), n, [
        None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little")),
        pa.py_buffer(np.arange(0, 4 * n + 1, 4, dtype=np.int32)),
        pa.py_buffer(lens.astype("<u4"))])
    order = np.empty(2 * n, np.int64)
    order[0::2] = np.arange(n)
    order[1::2] = np.arange(n, 2 * n)
    joined = pa.concat_arrays([heads, raw]).take(pa.array(order))
    jd = joined.buffers()[2]
    plain = np.frombuffer(jd, np.uint8) if jd is not None else np.zeros(0, np.uint8)
    at = np.frombuffer(joined.buffers()[1], np.int32, 2 * n + 1, joined.offset)[2 * bounds]
    starts = bounds[:-1]
    nulls = (np.diff(bounds) - np.add.reduceat(valid.astype(np.int64), starts)) \
        if valid is not None else np.zeros(len(starts), np.int64)
    return _Prepared(plain, (at - at[0]).tolist(), valid, nulls.tolist(), [], [],
                     np.add.reduceat(lens, starts).tolist())


def _string_limits(table: pa.Table, rows: np.ndarray) -> list[tuple[list[bytes], list[bytes]]]:
    """Per string column of ``table``, each file's least and greatest value (b"" for a
    file without values: its statistics hold none): one hash aggregation by file for the
    columns together (2.9 ms for four columns of 128 files, against 5.9 for a ``min_max``
    a file and column)."""
    # Columns renamed by position: a dimension may have any name, the file number's too.
    count = table.num_columns
    named = pa.table([*table.columns, np.repeat(np.arange(len(rows), dtype=np.int32), rows)],
                     names=[str(n) for n in range(count + 1)])
    got = named.group_by(str(count), use_threads=False).aggregate(
        [(str(n), "min_max") for n in range(count)])
    got = got.take(pc.sort_indices(got.column(str(count))))  # by file, whatever the order
    out = []
    for n in range(count):
        both = got.column(f"{n}_min_max").combine_chunks()
        lows = both.field("min").view(pa.binary()).to_pylist()
        highs = both.field("max").view(pa.binary()).to_pylist()
        out.append(([b or b"" for b in lows], [b or b"" for b in highs]))
    return out


def _validity(arr: pa.Array) -> np.ndarray | None:
    if not arr.null_count:
        return None
    return np.asarray(arr.is_valid())


@lru_cache(maxsize=4096)
def _all_valid_levels(n: int) -> bytes:
    """The definition levels of ``n`` values, none null: one RLE run of 1s, after the
    4-byte length a data page v1 puts before them."""
    run = uvarint(n << 1) + b"\x01"
    return struct.pack("<I", len(run)) + run


def _levels(valid: np.ndarray | None, a: int, n: int, nulls: int) -> bytes:
    """The definition levels of rows ``a`` to ``a + n``: one RLE run when none is null,
    else one bit-packed run of the validity bits (the hybrid encoding's groups of 8, the
    last padded)."""
    if not nulls or valid is None:
        return _all_valid_levels(n)
    bits = np.packbits(valid[a:a + n], bitorder="little").tobytes()
    run = uvarint((((n + 7) // 8) << 1) | 1) + bits
    return struct.pack("<I", len(run)) + run


@lru_cache(maxsize=64)
def _encoder(schema: pa.Schema, codecs: tuple[str, ...]) -> PlainFiles | None:
    columns = []
    for f, codec in zip(schema, codecs, strict=True):
        if codec not in _CODECS:
            return None
        if pa.types.is_string(f.type):
            strings = True
        elif f.type == pa.int64() or (pa.types.is_timestamp(f.type) and f.type.unit == "ms"):
            strings = False
        else:
            return None
        physical = _BYTE_ARRAY if strings else _INT64
        name = f.name.encode()
        meta_head = b"".join((
            b"\x26\x00\x1c",  # ColumnChunk: file_offset 0, then its ColumnMetaData
            b"\x15", zigzag(physical), b"\x19", list_header(2, I32), zigzag(_RLE),
            zigzag(_PLAIN), b"\x19", list_header(1, BINARY), binary(name),
            b"\x15", zigzag(_CODECS[codec]), b"\x16"))
        size_head = b"\x3c" if strings or f.nullable else b""
        arrow_codec = _ARROW_CODECS.get(codec)
        columns.append(_Column(strings, f.nullable,
                               pa.Codec(arrow_codec) if arrow_codec else None,
                               meta_head, size_head))
    prefix, suffix = _template(schema, codecs)
    if prefix is None or suffix is None:
        return None
    return PlainFiles(schema, columns, prefix, suffix)


def _template(schema: pa.Schema, codecs: tuple[str, ...]) -> tuple[bytes | None, bytes | None]:
    """pyarrow's own footer for ``schema``: its version and schema fields (the prefix) and
    its key-value metadata, ``created_by`` and column orders (the suffix, with the stop
    byte), copied into every footer written here."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink, use_dictionary=False,
                   compression=dict(zip(schema.names, codecs, strict=True)))
    raw = sink.getvalue().to_pybytes()
    size = struct.unpack("<I", raw[-8:-4])[0]
    footer = raw[-8 - size:-8]
    fields, end = read_struct(footer)
    if [f.id for f in fields] != [1, 2, 3, 4, 5, 6, 7] or end != len(footer):
        return None, None
    return footer[:fields[1].end], footer[fields[4].start:]
