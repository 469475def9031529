"""CSV header lines, compressed input and processedBytes as Druid reads text input, through
both phase-1 readers.

Expected values from Druid's documentation, not from this pipeline:
- https://druid.apache.org/docs/latest/ingestion/data-formats#csv (skipHeaderRows: "the task
  will skip the first skipHeaderRows rows"; findColumnsFromHeader: "skipHeaderRows will be
  applied before finding column names from the header ... skip the first two lines and then
  extract column information from the third line").
- https://druid.apache.org/docs/latest/ingestion/tasks#task-reports (thrownAway "doesn't
  include the rows skipped by explicit user configurations. For example, the rows skipped by
  skipHeaderRows or hasHeaderRow in the CSV format are not counted").
- https://druid.apache.org/docs/latest/ingestion/input-sources (local, s3, http: files with
  a compression extension, .gz .bz2 .xz .zst among them, are decompressed as they are read).
- https://github.com/apache/druid/pull/13520 (processedBytes: "the uncompressed input bytes
  ... the total size of the unzipped wikipedia.json file (and not the wikipedia.json.gz)";
  "Records that are counted as unparseable, thrownAway or processedWithErrors also count").
"""

from __future__ import annotations

import bz2
import gzip
import lzma
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.helpers.ingestion import daemons, spark  # noqa: F401  (fixtures)
from tests.helpers.parity import READERS, ordered, run, spec_for

pytestmark = pytest.mark.spark

TITLE = "# nycflights13 export\nsource: a title line, then a blank one\n\n"
BODY = ("2013-01-01T05:00:00Z,EWR,1400\n"
        "2013-01-01T06:00:00Z,JFK,944\n"
        "2013-01-02T07:00:00Z,JFK,1000\n")
HEADER = "ts,origin,distance\n"
METRICS = [{"type": "count", "name": "count"},
           {"type": "longSum", "name": "distance", "fieldName": "distance"}]
ROWS = ordered([
    {"__time": "2013-01-01T00:00:00Z", "origin": "EWR", "count": 1, "distance": 1400},
    {"__time": "2013-01-01T00:00:00Z", "origin": "JFK", "count": 1, "distance": 944},
    {"__time": "2013-01-02T00:00:00Z", "origin": "JFK", "count": 1, "distance": 1000},
])


def _csv(base: Path, fmt: dict[str, Any], filter_: str = "*.csv*") -> dict[str, Any]:
    return spec_for(base, {"type": "csv", **fmt}, dimensions=["origin"], metrics=METRICS,
                    filter_=filter_)


@pytest.mark.parametrize("reader", READERS)
def test_skip_header_rows_then_the_header(spark: Any, daemons: list[Any], tmp_path: Path,
                                          reader: str) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text(TITLE + HEADER + BODY)
    (tmp_path / "in" / "b.csv").write_text(TITLE + HEADER)  # a file of headers only
    spec = _csv(tmp_path / "in", {"findColumnsFromHeader": True, "skipHeaderRows": 3})
    rows, stats, events, _ = run(spec, [daemons[0].url], tmp_path / "out", reader)
    assert rows == ROWS
    assert (stats["processed"], stats["processedWithError"], stats["unparseable"],
            stats["thrownAway"]) == (3, 0, 0, 0), events


@pytest.mark.parametrize("reader", READERS)
def test_skip_header_rows_with_listed_columns(spark: Any, daemons: list[Any], tmp_path: Path,
                                              reader: str) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text(TITLE + BODY)
    spec = _csv(tmp_path / "in", {"columns": ["ts", "origin", "distance"], "skipHeaderRows": 3})
    rows, stats, events, _ = run(spec, [daemons[0].url], tmp_path / "out", reader)
    assert rows == ROWS
    assert (stats["processed"], stats["unparseable"], stats["thrownAway"]) == (3, 0, 0), events


def _compress(data: bytes, ext: str) -> bytes:
    if ext == "gz":
        return gzip.compress(data)
    if ext == "bz2":
        return bz2.compress(data)
    if ext == "xz":
        return lzma.compress(data)
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("ext", ["gz", "bz2", "zst", "xz"])
@pytest.mark.parametrize("reader", READERS)
def test_compressed_csv_with_its_header(spark: Any, daemons: list[Any], tmp_path: Path,
                                        reader: str, ext: str) -> None:
    (tmp_path / "in").mkdir()
    text = (TITLE + HEADER + BODY).encode()
    (tmp_path / "in" / f"flights.csv.{ext}").write_bytes(_compress(text, ext))
    spec = _csv(tmp_path / "in", {"findColumnsFromHeader": True, "skipHeaderRows": 3})
    rows, stats, events, report = run(spec, [daemons[0].url], tmp_path / "out", reader)
    assert rows == ROWS
    assert (stats["processed"], stats["unparseable"], stats["thrownAway"]) == (3, 0, 0), events
    # processedBytes: the uncompressed bytes, every line (skipped ones too)
    assert stats["processedBytes"] == len(text)
    assert report["phases"]["partialSegmentGeneration"]["reader"] == reader


@pytest.mark.parametrize("reader", READERS)
def test_processed_bytes_are_the_inputs_bytes_whatever_the_rows_became(
        spark: Any, daemons: list[Any], tmp_path: Path, reader: str) -> None:
    (tmp_path / "in").mkdir()
    lines = ['{"ts": "2013-01-01T05:00:00Z", "origin": "EWR", "distance": 1}',
             '{"ts": "2013-01-01T05:00:00Z", "origin": "EWR", "distance": "far"}',
             '{"ts": "not a time", "origin": "EWR"}', '{"broken',
             '{"ts": "2019-01-01T00:00:00Z", "origin": "LGA", "distance": 2}']
    (tmp_path / "in" / "a.json").write_text("\n".join(lines) + "\n")
    gz = "\n".join(lines[:1]) + "\n"
    (tmp_path / "in" / "b.json.gz").write_bytes(gzip.compress(gz.encode()))
    spec = spec_for(tmp_path / "in", {"type": "json"}, dimensions=["origin"], metrics=METRICS,
                    filter_="*.json*")
    spec["spec"]["dataSchema"]["granularitySpec"]["intervals"] = ["2013-01-01/2014-01-01"]
    _, stats, _, _ = run(spec, [daemons[0].url], tmp_path / "out", reader)
    assert (stats["processed"], stats["processedWithError"], stats["unparseable"],
            stats["thrownAway"]) == (2, 1, 2, 1)
    assert stats["processedBytes"] == (tmp_path / "in" / "a.json").stat().st_size + len(gz.encode())
