"""The native JSON/CSV reader computes phase 1's rows exactly as the JVM reader does.

Each spec here is read both ways and the prepared rows compared row for row
(:mod:`tests.helpers.native_text`): timestamps of every format, typed dimensions and metrics,
CSV quoting and bad lines, flatten paths, multi-value dimensions, first/last and sketch
inputs, transforms and filters; the casts themselves against Spark on generated corpora.
Full ingestions (both readers publishing the same segments) are in test_native_text_e2e.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shuffled.spark.phase1.spark_compat import casts as spark_casts
from shuffled.spark.phase1.spark_compat import timestamps as spark_time
from tests.helpers.ingestion import base_spec, generate, spark, write_parts  # noqa: F401
from tests.helpers.native_text import bad_lines, check_lines, prepared_both, text_spec, write_lines

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[3]


def test_generated_json_rows_and_bad_lines(spark: Any, tmp_path: Path) -> None:
    """Skewed keys, nulls, absent fields, malformed lines, bad timestamps and metrics, rows
    outside the intervals: the same rows, reasons and raw text; lines numbered right."""
    lines, good, bad = generate(3000, seed=5)
    erred = sum(1 for g in good if g.get("error"))
    write_parts(lines, tmp_path / "in", parts=2)
    spec = base_spec(tmp_path / "in", {"type": "hashed", "numShards": 1})
    jvm, native, table = prepared_both(spark, spec)
    assert jvm == native and len(native) == 3000
    found = bad_lines(table)
    assert erred and len(found) == bad + erred and {r for _, _, r, _ in found} >= {
        "malformed json record", "unparseable timestamp [not a time]",
        # every metric reading the field, in the spec's order (the row is kept)
        "field [clicks] of metric [clicks]: not a number [many]; "
        "field [clicks] of metric [max_clicks]: not a number [many]"}
    check_lines(found)


def test_druid_tutorials(spark: Any) -> None:
    """The rollup tutorial of examples/ and Druid's transform and flatten examples."""
    for path, base in (("examples/rollup-tutorial/rollup-index.json", "examples/rollup-tutorial"),
                       ("tests/data/druid/transform/transform-index.json", "tests/data/druid/transform"),
                       ("tests/data/druid/flatten/flatten-index.json", "tests/data/druid/flatten")):
        spec = json.loads((ROOT / path).read_text())
        spec["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(ROOT / base)
        jvm, native, _ = prepared_both(spark, spec)
        assert jvm == native and native, path


TIMES: list[Any] = [
    "2018-01-01T00:00:00Z", "2018-01-01T10:11:12.345Z", "2018-01-01 10:11:12", "2018-1-2T3:4:5Z",
    " 2018-01-01T00:00:00.123456789+05:30 ", "2018-02-30T00:00:00Z", "2018", "2018-06",
    "1514764800000", "-1000", "1.5e12", "garbage", "", None, 1514764800000, 1514764800, -5,
    "2018-01-01T10:00:00 UTC", "2018-01-01T10:00:00GMT+1", "2018-01-01T10Z", "1e30", "  12  ",
    "+002018-01-01", "2018-01-01T10:00:00-18:00", "2018-01-01T10:00:00+18:30", "0x10",
]


@pytest.mark.parametrize("fmt", ["auto", "iso", "millis", "posix", "micro", "nano"])
def test_timestamp_formats(spark: Any, tmp_path: Path, fmt: str) -> None:
    """Text and JSON numbers in one column (pyarrow reads them as runs of one type each)."""
    write_lines(tmp_path / "in" / "a.json",
                [{"ts": t, "d": str(i)} if t is not None else {"d": str(i)} for i, t in enumerate(TIMES)])
    spec = text_spec(tmp_path / "in", "json", timestampSpec={"column": "ts", "format": fmt},
                     granularitySpec={"segmentGranularity": "year", "queryGranularity": "none"})
    jvm, native, _ = prepared_both(spark, spec)
    assert jvm == native
    if fmt == "auto":
        missing = text_spec(tmp_path / "in", "json",
                            timestampSpec={"column": "ts", "format": fmt, "missingValue": "2019-01-01"})
        jvm, native, _ = prepared_both(spark, missing)
        assert jvm == native


def test_typed_dimensions_and_metrics(spark: Any, tmp_path: Path) -> None:
    values: list[Any] = [1, -7, 2.5, -2.5, "12", " 13 ", "1.9", "-1.9", "1e3", "1e30", "NaN",
                         "Infinity", "0x1p3", "1.5d", "", "abc", True, None, 9007199254740993,
                         "9223372036854775808", 12345678901234567890]
    rows = [{"ts": "2018-01-01T00:00:00Z", "l": v, "f": v, "g": v, "m": v, "s": v} for v in values]
    write_lines(tmp_path / "in" / "a.json", rows)
    # "s": text of integers read as float64 (2.5 is among them) comes from their lines
    spec = text_spec(tmp_path / "in", "json",
                     dimensionsSpec={"dimensions": ["s", {"name": "l", "type": "long"},
                                                    {"name": "f", "type": "float"},
                                                    {"name": "g", "type": "double"}]},
                     metricsSpec=[{"type": "count", "name": "count"},
                                  {"type": "longSum", "name": "ls", "fieldName": "m"},
                                  {"type": "doubleMax", "name": "dm", "fieldName": "m"},
                                  {"type": "floatMin", "name": "fm", "fieldName": "m"}])
    jvm, native, table = prepared_both(spark, spec)
    assert jvm == native
    assert any("dimension [l]: not a long [abc]" in r for _, _, r, _ in bad_lines(table))


def test_csv(spark: Any, tmp_path: Path) -> None:
    """Headers (and a header line again mid-file), quoted values, empty and quoted-empty
    values, blank and space-only lines, CRLF, too few and too many values."""
    header = "ts,d,n"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("\n".join([
        header, "2018-01-01T00:00:00Z,x,1", '2018-01-01T01:00:00Z,"y, z",2', "2018-01-01T02:00:00Z,,3",
        '2018-01-01T03:00:00Z,"",4', "", "   ", "2018-01-01T04:00:00Z,w", "2018-01-01T05:00:00Z,a,b,c",
        header, "bad time,q,5", "2018-01-01T06:00:00Z,é ü,x", "\t", "2018-01-01T07:00:00Z,null,7"]) + "\n")
    (tmp_path / "in" / "b.csv").write_bytes(b"ts,d,n\r\n2018-01-02T00:00:00Z,crlf,9\r\n\r\n"
                                            b"2018-01-02T01:00:00Z,last,10")
    spec = text_spec(tmp_path / "in", {"type": "csv", "findColumnsFromHeader": True},
                     timestampSpec={"column": "ts", "format": "iso"},
                     metricsSpec=[{"type": "count", "name": "count"},
                                  {"type": "longSum", "name": "n", "fieldName": "n"}])
    jvm, native, table = prepared_both(spark, spec)
    assert jvm == native
    found = bad_lines(table)
    assert {r for _, _, r, _ in found} == {"malformed csv record", "unparseable timestamp [bad time]",
                                           "field [n] of metric [n]: not a number [x]"}
    check_lines(found)
    columns = text_spec(tmp_path / "in", {"type": "csv", "columns": ["ts", "d", "n"]},
                        timestampSpec={"column": "ts", "format": "auto"})
    jvm, native, _ = prepared_both(spark, columns)
    assert jvm == native


def test_flatten(spark: Any, tmp_path: Path) -> None:
    """Paths through arrays, through values that are not objects in some rows, and
    without field discovery."""
    write_lines(tmp_path / "in" / "a.json", [
        {"ts": "2018-01-01T00:00:00Z", "o": {"a": {"b": 1}, "l": [{"c": "x"}, {"c": "y"}]}, "k": "v"},
        {"ts": "2018-01-01T01:00:00Z", "o": "text", "k": 5},
        {"ts": "2018-01-01T02:00:00Z", "o": {"a": "flat", "l": {"c": "z"}}},
        {"ts": "2018-01-01T03:00:00Z", "o": {"a": {"b": "two"}, "l": []}, "k": True},
        {"ts": "2018-01-01T04:00:00Z"}, '{"ts": "2018-01-01T05:00:00Z", "o": {"a": {"b": null}}}'])
    for discover in (True, False):
        flat = {"useFieldDiscovery": discover, "fields": [
            {"type": "path", "name": "b", "expr": "$.o.a.b"},
            {"type": "jq", "name": "c1", "expr": ".o.l[1].c"},
            {"type": "path", "name": "c0", "expr": "$.o.l[0].c"},
            {"type": "root", "name": "ts"}]}
        spec = text_spec(tmp_path / "in", {"type": "json", "flattenSpec": flat},
                         dimensionsSpec={"dimensions": ["b", "c1", "c0", "k"]})
        jvm, native, _ = prepared_both(spark, spec)
        assert jvm == native


def test_multi_value_dimensions(spark: Any, tmp_path: Path) -> None:
    """Arrays of strings, integers and booleans, empty and one-element arrays, nulls in
    them, text that looks like an array, U+0000; each handling; range dimensions refuse
    several values."""
    values: list[Any] = [["b", "a", "b"], ["a", "b"], [], "[not an array", ["a\u0000b"],
                         ["z", None, "c"], [3, 1, 3], [True, None, False], ["y"], [None], "x", None]
    rows = [{"ts": "2018-01-01T00:00:00Z", "s": v, "t": v if not isinstance(v, list) or all(
        isinstance(x, str) or x is None for x in v) else None, "a": v, "r": ["p", "q"][i % 2]
             if i != 6 else ["p", "q"]} for i, v in enumerate(values)]
    write_lines(tmp_path / "in" / "a.json", rows)
    dims = [{"name": "s", "multiValueHandling": "SORTED_ARRAY"},
            {"name": "t", "multiValueHandling": "SORTED_SET"},
            {"name": "a", "multiValueHandling": "ARRAY"}, "r"]
    spec = text_spec(tmp_path / "in", "json", dimensionsSpec={"dimensions": dims})
    spec["spec"]["tuningConfig"]["partitionsSpec"] = {"type": "range", "partitionDimensions": ["r"],
                                                      "targetRowsPerSegment": 2}
    jvm, native, table = prepared_both(spark, spec)
    assert jvm == native
    reasons = {r for _, _, r, _ in bad_lines(table)}
    assert "dimension [r]: multi-value in a range partition dimension" in reasons
    assert "dimension [s]: a value contains U+0000" in reasons


def test_first_last_and_sketch_inputs(spark: Any, tmp_path: Path) -> None:
    rows = [{"ts": f"2018-01-01T0{i % 3}:00:00Z", "d": "x", "v": v, "s": s, "t": t}
            for i, (v, s, t) in enumerate([(1, "a" * 20, 5), (2.5, "b", "7"), ("x", None, None),
                                           (None, "ccc", "1e3"), (7, "d", "oops")])]
    write_lines(tmp_path / "in" / "a.json", rows)
    spec = text_spec(tmp_path / "in", "json", metricsSpec=[
        {"type": "count", "name": "count"},
        {"type": "doubleFirst", "name": "df", "fieldName": "v"},
        {"type": "longLast", "name": "ll", "fieldName": "v", "timeColumn": "t"},
        {"type": "stringFirst", "name": "sf", "fieldName": "s", "maxStringBytes": 5},
        {"type": "thetaSketch", "name": "th", "fieldName": "s"},
        {"type": "quantilesDoublesSketch", "name": "q", "fieldName": "v"}])
    jvm, native, _ = prepared_both(spark, spec)
    assert jvm == native


def test_blank_and_null_lines_and_lines_across_blocks(spark: Any, tmp_path: Path) -> None:
    """Long lines crossing 64 KiB block ends, blank, tab-only and ``null`` lines (pyarrow
    crashes on a first row that is null; Spark reads one as malformed)."""
    rnd = random.Random(3)
    lines: list[Any] = ["null", "", "   ", "\t"]
    for i in range(400):
        lines.append({"ts": "2018-01-01T00:00:00Z", "d": "x" * rnd.randint(0, 900), "n": i})
        if i % 97 == 0:
            lines += ["null", "  null  ", "[1, 2]", "42", '"text"', "{}"]
    write_lines(tmp_path / "in" / "a.json", lines)
    jvm, native, table = prepared_both(spark, text_spec(tmp_path / "in", "json"), block=1 << 16)
    assert jvm == native
    check_lines(bad_lines(table))


def _corpus(rnd: random.Random, n: int) -> list[str]:
    pieces = ["", "+", "-", " ", "0", "1", "9", ".", "e", "E", "5", "d", "x", "inf", "NaN", "\t",
              "2018", "-01", "-1", "T", ":", "10", ":30", "Z", "+01:00", " UTC", "1e3", "0x1p3"]
    return ["".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 7))) for _ in range(n)]


def test_casts_equal_sparks_on_a_corpus(spark: Any) -> None:
    """try_cast of text to BIGINT, DOUBLE, FLOAT and TIMESTAMP: Arrow's and Spark's agree."""
    from pyspark.sql import functions as F

    from shuffled.spark.driver.sparksession import job_conf

    rnd = random.Random(7)
    values = _corpus(rnd, 4000) + [
        "2018-01-01T10Z", "2018-01-01t10:00:00Z", "2018-01-01T10:00Z", "2018-01-01T10:00:00z",
        "2018-01-01T10:00:00+19:00", "2018-01-01T10:00:00.Z", "-290308-12-21T19:59:05.224192Z",
        "294247-01-10T04:00:54.775808Z", "9223372036854775807", "-9223372036854775808", "1.5F"]
    df = spark.createDataFrame([(v,) for v in values], "s string")
    with job_conf(spark):
        rows = df.select(F.unix_micros(F.col("s").try_cast("timestamp")), F.col("s").try_cast("bigint"),
                         F.col("s").try_cast("double"), F.col("s").try_cast("float")).collect()
    arr = pa.array(values)
    got = list(zip(spark_time.to_micros(arr).to_pylist(), spark_casts.to_long(arr).to_pylist(),
                   spark_casts.to_double(arr).to_pylist(), spark_casts.to_float(arr).to_pylist()))

    def same(a: Any, b: Any) -> bool:
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))

    wrong = [(v, tuple(r), g) for v, r, g in zip(values, rows, got)
             if not all(same(x, y) for x, y in zip(r, g))]
    assert not wrong, wrong[:10]
    # One value at a time: the all-canonical fast path sees whole arrays of one shape.
    for v in values[-11:-4]:
        assert spark_time.to_micros(pa.array([v] * 3)).to_pylist()[0] == rows[values.index(v)][0], v


def _read_all(spec: dict[str, Any]) -> list[pa.Table]:
    from shuffled.spark.phase1.native.reader import SplitSizing, plan_native, read_split
    from shuffled.spark.phase1.source import resolve_files
    from shuffled.spark.spec.model import PartitionPlan
    from shuffled.spark.spec.parse import parse_spec

    s = parse_spec(spec)
    planned = plan_native(s, PartitionPlan("hashed", (), num_shards=1), resolve_files(s),
                          SplitSizing(max_bytes=1 << 16, open_cost=0, parallelism=2))
    assert not isinstance(planned, str), planned
    native, tasks = planned
    return [t for task in tasks for split in task for t in read_split(split, native, [])]


@pytest.mark.parametrize("content,what", [
    (b'{"ts": "2018-01-01T00:00:00Z", "d": "a"}\r{"ts": "2018-01-01T00:00:00Z", "d": "b"}\n',
     "lone carriage return"),
    (b'{"ts": "2018-01-01T00:00:00Z", "d": "a"}\n{\'ts\': \'2018\', \'d\': \'q\'}\n', "Spark's parser reads"),
    (b'{"ts": "2018-01-01T00:00:00Z", "d": "a"} {"ts": "2019"}\n{"ts": "2018"}\n',
     "more than one JSON value"),
    (b'{"ts": "2018-01-01T00:00:00Europe/Paris", "d": "a"}\n', "region time zone"),
    (b'{"ts": "2018-01-01T00:00:00Z", "d": NaN}\n', "NaN or Infinity"),
])
def test_what_the_native_reader_declines_in_the_data(tmp_path: Path, content: bytes, what: str) -> None:
    """Found only in a task: Declined (the driver then runs phase 1 through the JVM)."""
    from shuffled.spark.phase1.native.text.blocks import Declined
    from shuffled.spark.phase1.spark_compat.timestamps import RegionZone

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_bytes(content)
    with pytest.raises((Declined, RegionZone), match=what):
        _read_all(text_spec(tmp_path / "in", "json"))


def test_csv_quoting_the_parsers_read_differently_is_declined(tmp_path: Path) -> None:
    from shuffled.spark.phase1.native.text.blocks import Declined

    (tmp_path / "in").mkdir()
    for i, line in enumerate(['2018-01-01T00:00:00Z,"a""b"', '2018-01-01T00:00:00Z,"x"y',
                              '2018-01-01T00:00:00Z,"back\\slash"']):
        (tmp_path / "in" / "a.csv").write_text(f"ts,d\n2018-01-01T00:00:00Z,plain\n{line}\n")
        with pytest.raises(Declined, match="a.csv:3: CSV quoting"):
            _read_all(text_spec(tmp_path / "in", {"type": "csv", "findColumnsFromHeader": True}))
    (tmp_path / "in" / "a.csv").write_text('ts,d\n2018-01-01T00:00:00Z,"quoted, fine"\n')
    tables = _read_all(text_spec(tmp_path / "in", {"type": "csv", "findColumnsFromHeader": True}))
    assert [t.column("d").to_pylist() for t in tables] == [["quoted, fine"]]
