"""Small segments' Parquet files encoded by ``parquetfile.plain``, held against two
references: pyarrow's own writer (the footer it writes for the same table and options,
field for field, sizes and offsets aside: those follow from the bytes) and two readers
(pyarrow's and DuckDB's, which has its own Parquet reader) reading the rows back.

The Parquet format: https://github.com/apache/parquet-format (parquet.thrift; the encodings
in Encodings.md: PLAIN, and the RLE/bit-packed hybrid for the definition levels)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffled.spark.phase2.parquetfile.plain import MAX_ROWS, MAX_STAT_BYTES, PlainFiles
from shuffled.spark.phase2.parquetfile.thrift import ThriftError, as_dict, read_struct, zigzag

TS = pa.timestamp("ms", tz="UTC")


def _footer(data: bytes) -> dict[int, object]:
    assert data[:4] == b"PAR1" and data[-4:] == b"PAR1"
    size = struct.unpack("<I", data[-8:-4])[0]
    fields, end = read_struct(data[-8 - size:-8])
    assert end == size  # nothing after the footer's stop byte
    return as_dict(fields)


def _without_sizes(footer: dict[int, object]) -> dict[int, object]:
    """A footer with what follows from the page bytes taken out: the row group's sizes and
    each column's sizes and page offset (definition levels may be spelled in other runs)."""
    group = footer[4][0]  # type: ignore[index]
    group.pop(2)  # total_byte_size
    group.pop(6)  # total_compressed_size
    for chunk in group[1]:
        for k in (6, 7, 9):  # total sizes, data_page_offset
            chunk[3].pop(k)
    return footer


def _pyarrow(table: pa.Table, codecs: dict[str, str]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=codecs, use_dictionary=False)
    return sink.getvalue().to_pybytes()


def _check(table: pa.Table, data: bytes | None, codecs: dict[str, str]) -> None:
    assert data is not None
    back = pq.read_table(io.BytesIO(data))
    assert back.schema.equals(table.schema, check_metadata=True)
    assert back.equals(table)
    assert _without_sizes(_footer(data)) == _without_sizes(_footer(_pyarrow(table, codecs)))


def _table(rows: int, seed: int, nulls: float) -> pa.Table:
    rng = np.random.default_rng(seed)

    def maybe(values: list[object]) -> list[object]:
        return [None if rng.random() < nulls else v for v in values]

    words = ["", "a", "ab", "b", "zz", "é", "日本", "a\x00b", "x" * 40]
    return pa.table({
        "__time": pa.array(np.sort(rng.integers(-10**12, 10**12, rows)), TS),
        "country": pa.array(maybe([f"c{i}" for i in rng.integers(0, 20, rows)]), pa.string()),
        "odd": pa.array(maybe([words[i] for i in rng.integers(0, len(words), rows)]),
                        pa.string()),
        "count": pa.array(maybe(rng.integers(-(2**62), 2**62, rows).tolist()), pa.int64()),
    }, schema=pa.schema([pa.field("__time", TS, nullable=False),
                         pa.field("country", pa.string()), pa.field("odd", pa.string()),
                         pa.field("count", pa.int64())]))


CODECS = [{"__time": "lz4", "country": "zstd", "odd": "none", "count": "lz4"},
          {"__time": "none", "country": "lz4", "odd": "lz4", "count": "zstd"}]


@pytest.mark.parametrize("codecs", CODECS)
def test_a_batch_of_files_is_what_pyarrow_writes(codecs: dict[str, str]) -> None:
    tables = [_table(rows, seed, nulls) for seed, (rows, nulls) in enumerate(
        [(410, 0.0), (1, 0.0), (3, 0.5), (MAX_ROWS, 0.1), (77, 1.0), (9, 0.9), (200, 0.0)])]
    files = PlainFiles.of(tables[0].schema, codecs)
    assert files is not None
    for table, data in zip(tables, files.encode(tables), strict=True):
        _check(table, data, codecs)


def test_slices_and_chunked_columns_are_encoded_as_their_rows(tmp_path: Path) -> None:
    """The merge hands over slices of one sorted table: buffers with an offset, and chunks."""
    whole = _table(900, 7, 0.2)
    parts = [whole.slice(3, 400), pa.concat_tables([whole.slice(500, 5), whole.slice(10, 90)]),
             whole.slice(899, 1)]
    files = PlainFiles.of(whole.schema, CODECS[0])
    assert files is not None
    encoded = files.encode(parts)
    for n, (table, data) in enumerate(zip(parts, encoded, strict=True)):
        _check(table, data, CODECS[0])
        assert data is not None
        (tmp_path / f"{n}.parquet").write_bytes(data)
    # DuckDB's own reader: the same rows, the same order.
    for n, table in enumerate(parts):
        got = duckdb.sql(f"SELECT * FROM read_parquet('{tmp_path / f'{n}.parquet'}')").arrow()
        got = got.read_all() if hasattr(got, "read_all") else got
        assert got.column("country").to_pylist() == table.column("country").to_pylist()
        assert got.column("odd").to_pylist() == table.column("odd").to_pylist()
        assert got.column("count").to_pylist() == table.column("count").to_pylist()
        assert [t.timestamp() for t in got.column("__time").to_pylist()] == \
            [t.timestamp() for t in table.column("__time").to_pylist()]


@given(rows=st.integers(1, MAX_ROWS), seed=st.integers(0, 2**32 - 1),
       nulls=st.sampled_from([0.0, 0.01, 0.5, 1.0]), codecs=st.sampled_from(CODECS))
@settings(max_examples=40, deadline=None)
def test_any_small_table_is_what_pyarrow_writes(rows: int, seed: int, nulls: float,
                                                codecs: dict[str, str]) -> None:
    table = _table(rows, seed, nulls)
    files = PlainFiles.of(table.schema, codecs)
    assert files is not None
    _check(table, files.encode([table])[0], codecs)


def test_any_column_names_are_encoded() -> None:
    """The strings' limits are aggregated under names of their own: a dimension may be
    called anything, "0" or "1_min_max" too."""
    table = _table(50, 3, 0.2).rename_columns(["__time", "1", "0_min_max", "2"])
    files = PlainFiles.of(table.schema, dict(zip(table.column_names, CODECS[0].values())))
    assert files is not None
    _check(table, files.encode([table])[0], dict(zip(table.column_names, CODECS[0].values())))


def test_what_is_not_encoded_here_is_left_to_pyarrow() -> None:
    """None, for the caller to write with pyarrow: past the plain size, no rows, another
    schema, a string past pyarrow's statistics size; and no encoder at all for a column
    type or codec not encoded here."""
    table = _table(MAX_ROWS + 1, 1, 0.1)
    files = PlainFiles.of(table.schema, CODECS[0])
    assert files is not None
    long = table.slice(0, 2).set_column(1, table.schema.field(1),
                                        pa.array(["x" * MAX_STAT_BYTES, "y"]))
    other = table.slice(0, 2).rename_columns(["__time", "a", "b", "c"])
    got = files.encode([table, table.slice(0, 0), other, table.slice(0, 5)])
    assert got[:3] == [None] * 3
    _check(table.slice(0, 5), got[3], CODECS[0])
    # A string too long for the statistics leaves its whole batch to pyarrow.
    assert files.encode([long, table.slice(0, 5)]) == [None, None]
    floats = pa.schema([pa.field("__time", TS, nullable=False), pa.field("m", pa.float64())])
    assert PlainFiles.of(floats, {"__time": "lz4", "m": "lz4"}) is None
    assert PlainFiles.of(table.schema, {**CODECS[0], "count": "brotli"}) is None
    lists = pa.schema([pa.field("tags", pa.list_(pa.string()))])
    assert PlainFiles.of(lists, {"tags": "lz4"}) is None


def test_the_compact_protocol_reads_what_it_wrote_and_refuses_truncation() -> None:
    for n in (0, 1, 63, 64, 127, 128, 2**15 - 1, 2**15, 2**40, -1, -(2**63)):
        fields, _ = read_struct(b"\x16" + zigzag(n) + b"\x00")
        assert fields[0].value == n
    data = _pyarrow(_table(5, 1, 0.0), CODECS[0])
    size = struct.unpack("<I", data[-8:-4])[0]
    with pytest.raises(ThriftError):
        read_struct(data[-8 - size:-9])
