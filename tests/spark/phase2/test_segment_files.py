"""A segment's Parquet file (``merge._write``): the rows as merged, each column in its
spec's codec (tuningConfig.indexSpec), and dictionary pages only where they pay: a small
segment's columns are written plain (a dictionary per column costs more than it saves on
a few hundred values), a larger one's dictionary-encoded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shuffled.spark.phase2.merge import PLAIN_ROWS, _write
from shuffled.spark.phase2.plan import Phase2Config
from shuffled.spark.rows.rollup import Layout

LAYOUT = Layout((("country", "string"), ("user", "string")),
                (("count", "count", "sum", "long", None),))


def _segment(rows: int) -> pa.Table:
    rng = np.random.default_rng(rows)
    return pa.table({
        "__time": pa.array(np.sort(rng.integers(0, 24, rows)) * 3_600_000,
                           pa.timestamp("ms", tz="UTC")),
        "country": pa.array([f"c{i}" for i in rng.integers(0, 20, rows)]),
        "user": pa.array([None if i % 9 == 0 else f"u{i}" for i in rng.integers(0, 999, rows)]),
        "count": pa.array(rng.integers(1, 5, rows)),
    })


@pytest.mark.parametrize("rows", [1, PLAIN_ROWS, PLAIN_ROWS + 1, 20_000])
def test_a_segment_file_holds_its_rows_with_dictionaries_where_they_pay(
        rows: int, tmp_path: Path) -> None:
    cfg = Phase2Config("sup", layout=LAYOUT, segment_dir=str(tmp_path),
                       dimension_codec="zstd", metric_codec="lz4")
    table = _segment(rows)
    path = tmp_path / "seg.parquet"
    size = _write(table, str(path), cfg)
    assert size == path.stat().st_size
    assert pq.read_table(path).equals(table)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    for i, name in enumerate(table.column_names):
        col = meta.column(i)
        assert col.compression == ("ZSTD" if name in ("country", "user") else "LZ4")
        dictionary = any("DICTIONARY" in e for e in col.encodings)
        assert dictionary is (rows > PLAIN_ROWS), (name, col.encodings)
