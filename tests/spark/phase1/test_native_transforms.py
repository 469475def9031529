"""transformSpec on Arrow (the native reader) computes what the Spark translation computes.

Every expression and filter of test_spark_transforms (each checked there against DuckDB)
and more around Spark's own semantics (NaN ordering, LONG overflow, Java division, text
that is not a number) is evaluated both ways over the same rows and compared value for
value; a JSON spec with transforms is prepared both ways; what the Arrow translation
cannot compute falls back with a readerReason naming it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shuffled.spark.phase1.arrow_expr.transform import ArrowTranslator, filter_array, unsupported
from shuffled.spark.phase1.arrow_expr.values import DOUBLE, LONG, STRING, AVal, as_value
from shuffled.spark.spec.expr import parse_expr
from shuffled.spark.spec.transform import parse_filter, parse_transform_spec
from shuffled.spark.spec.base import JsonObject
from tests.helpers.ingestion import spark  # noqa: F401
from tests.helpers.native_text import prepared_both, text_spec, write_lines
from tests.helpers.transform_cases import EXPRESSIONS, FILTERS

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[3]

ROWS: dict[str, list[Any]] = {
    "s": ["Hello World", "abc", "", None, "x%y_z", "  pad  ", "NaN", "a\nb", "É", "true"],
    "n": [7, -3, 0, None, 100, -3037000500, 9223372036854775807, -9223372036854775808, 2, 1],
    "d": [2.5, -0.5, 0.0, None, 1000.0, -7.25, math.nan, math.inf, 1e300, -0.0],
    "t": ["12", "3.5", "abc", None, "-4", "1e3", "NaN", " 7 ", "9223372036854775808", "0x10"],
    "ts": ["2018-01-01T07:01:35Z", "2019-06-15T23:59:59Z", "garbage", None, "1969-12-31T23:00:00Z",
           "2020-02-29T12:00:00Z", "2018", "2018-01-01 10:00:00+05:30", "", "T10:00"],
    "dmy": ["01/02/2018 10:30", "31/12/1999 23:59", "2018-01-01", None, "29/02/2020 00:00", "x",
            "29/02/2019 00:00", "1/2/2018 10:30", "01/02/2018 10:30 ", "00/01/2018 00:00"],
    "ms": [1514790095123, 1560643199000, 0, None, -3600000, 1582977600000, -1, 1, 253402300799999,
           -62135596800000],
}
TYPES = {"s": STRING, "n": LONG, "d": DOUBLE, "t": STRING, "ts": STRING, "dmy": STRING, "ms": LONG}
SCHEMA = "id bigint, s string, n bigint, d double, t string, ts string, dmy string, ms bigint"

#: More expressions, around Spark's semantics rather than Druid's documentation.
MORE = ["d > 0", "d == d", "d < n", "n * n", "n + 1", "n - 1", "-n", "n / -1", "n % -1", "n / 0",
        "t * 1", "t + 0", "cast(t, 'LONG')", "cast(d, 'LONG')", "cast(d, 'STRING')", "d / 0",
        "d % 0", "d ^ 0.5", "n ^ 70", "1 ^ d", "t == 12", "s == t", "s < t", "if(d, 1, 2)",
        "nvl(d, n)", "concat(s, d, n)", "strlen(t)", "substring(t, 0, 1)", "substring(s, 1, -5)",
        "regexp_extract(s, '(l+)(o)', 2)", "regexp_like(s, '^a.b$')", "like(s, 'a_b')",
        "upper(s)", "timestamp_parse(ts)", "timestamp_parse(dmy, 'dd/MM/yyyy HH:mm')",
        "timestamp_format(ms, 'yyyy/MM/dd HH-mm-ss.SSS')", "timestamp_floor(ms, 'P3M')",
        "timestamp_floor(ms, 'PT6H', 3600000)", "case_simple(t, 12, 'twelve', 'other')",
        "abs(d)", "!d", "!n", "n && d", "s || t", "isnull(t * 1)", "__time / 1000"]
MORE_FILTERS: list[dict[str, Any]] = [
    {"type": "bound", "dimension": "d", "lower": "0", "ordering": "numeric"},
    {"type": "bound", "dimension": "t", "upper": "5", "upperStrict": True, "ordering": "numeric"},
    {"type": "selector", "dimension": "d", "value": "NaN"},
    {"type": "in", "dimension": "t", "values": ["12", "NaN", None]},
    {"type": "range", "column": "s", "matchValueType": "STRING", "lower": "", "lowerOpen": True},
    {"type": "regex", "dimension": "s", "pattern": "b$"},
    {"type": "like", "dimension": "s", "pattern": "a%"},
    {"type": "interval", "dimension": "ts", "intervals": ["2018-01-01/2019-01-01"]},
    {"type": "equality", "column": "d", "matchValueType": "DOUBLE", "matchValue": 2.5},
    {"type": "not", "field": {"type": "null", "column": "t"}},
]


@pytest.fixture(scope="module")
def frame(spark: Any) -> Any:
    n = len(ROWS["s"])
    rows = [(i, *(ROWS[k][i] for k in TYPES)) for i in range(n)]
    return spark.createDataFrame(rows, SCHEMA)


def _spark_columns(df: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from shuffled.spark.phase1.jvm.sqlexpr import LONG as SLONG, Val, input_val

    cols = {f.name: input_val(F.col(f.name), f.dataType, f.name, "$") for f in df.schema.fields}
    cols["__time"] = Val(F.col("ms"), SLONG)
    return cols


def _arrow_columns() -> dict[str, AVal]:
    types = {"n": pa.int64(), "d": pa.float64(), "ms": pa.int64()}
    cols = {k: AVal(pa.array(v, types.get(k, pa.string())), kind) for k, v in
            ((k, ROWS[k]) for k in TYPES) for kind in [TYPES[k]]}
    cols["__time"] = AVal(pa.array(ROWS["ms"], pa.int64()), LONG)
    return cols


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b and type(a) is type(b)


def test_expressions_equal_sparks(spark: Any, frame: Any) -> None:
    from shuffled.spark.driver.sparksession import job_conf
    from shuffled.spark.phase1.jvm.sqlexpr import Translator, as_value as spark_value

    exprs = [e for e, _ in EXPRESSIONS] + MORE
    translate = Translator(_spark_columns(frame), "$")
    cols = [spark_value(translate(parse_expr(e, "$"))).col.alias(f"c{i}") for i, e in enumerate(exprs)]
    with job_conf(spark):
        want = [tuple(r) for r in frame.orderBy("id").select(*cols).collect()]
    arrow = ArrowTranslator(_arrow_columns(), len(ROWS["s"]))
    got = [as_value(arrow(parse_expr(e, "$"))).arr.to_pylist() for e in exprs]
    wrong = [(e, row, want[row][i], got[i][row]) for i, e in enumerate(exprs)
             for row in range(len(want)) if not _same(want[row][i], got[i][row])]
    assert not wrong, wrong[:12]


def test_filters_equal_sparks(spark: Any, frame: Any) -> None:
    from pyspark.sql import functions as F

    from shuffled.spark.driver.sparksession import job_conf
    from shuffled.spark.phase1.jvm.filters import filter_column

    filters = [f for f, _ in FILTERS] + MORE_FILTERS
    cols = [filter_column(parse_filter(f, "$"), _spark_columns(frame), "$").alias(f"c{i}")
            for i, f in enumerate(filters)]
    with job_conf(spark):
        want = [tuple(r) for r in frame.orderBy("id").select(*cols).collect()]
    got = [filter_array(parse_filter(f, "$"), _arrow_columns(), len(ROWS["s"])).to_pylist()
           for f in filters]
    wrong = [(f, row, want[row][i], got[i][row]) for i, f in enumerate(filters)
             for row in range(len(want)) if want[row][i] != got[i][row]]
    assert not wrong, wrong[:12]
    assert F  # the import is used by filter_column's Columns


def test_json_transform_spec_prepared_alike(spark: Any, tmp_path: Path) -> None:
    """A __time transform, shadowed fields and a filter on a transform's output over JSON
    numbers, text and absent fields (Druid's tutorial: test_native_text)."""
    write_lines(tmp_path / "in" / "a.json", [
        {"ts": "2018-01-01T10:20:30Z", "d": "fr", "q": 3, "p": "1.25"},
        {"ts": "2018-01-01T11:20:30Z", "d": "de", "q": "4", "p": 2},
        {"ts": "2018-01-02T00:00:00Z", "q": 5.5, "p": None},
        {"ts": "2018-01-03T00:00:00Z", "d": "us", "q": "x", "p": "3"},
        {"ts": "bad", "d": "us"}])
    spec = text_spec(tmp_path / "in", "json",
                     dimensionsSpec={"dimensions": ["d", {"name": "band", "type": "long"}, "label"]},
                     metricsSpec=[{"type": "count", "name": "count"},
                                  {"type": "doubleSum", "name": "rev", "fieldName": "rev"}],
                     transformSpec={"transforms": [
                         {"type": "expression", "name": "__time", "expression": "timestamp_floor(__time, 'PT1H') + q"},
                         {"type": "expression", "name": "d", "expression": "upper(nvl(d, 'xx'))"},
                         {"type": "expression", "name": "band", "expression": "q / 2"},
                         {"type": "expression", "name": "label", "expression": "concat(d, '-', p * 2)"},
                         {"type": "expression", "name": "rev", "expression": "q * p"}],
                         "filter": {"type": "not", "field": {"type": "selector", "dimension": "d", "value": "DE"}}})
    jvm, native, _ = prepared_both(spark, spec)
    assert jvm == native


def test_what_arrow_cannot_compute_is_named() -> None:
    cases = {"regexp_like(s, '(?=a)b')": "regexp_like", "substring(s, n, 2)": "substring",
             "timestamp_parse(s, 'MMM d yyyy')": "timestamp_parse",
             "regexp_extract(s, 'a$')": "regexp_extract"}
    for expr, fn in cases.items():
        spec = parse_transform_spec(JsonObject({"transforms": [
            {"type": "expression", "name": "x", "expression": expr}]}, "$"))
        why = unsupported(spec)
        assert why and fn in why and "'x'" in why, (expr, why)
    spec = parse_transform_spec(JsonObject({"filter": {"type": "regex", "dimension": "s",
                                                       "pattern": "(a)\\1"}}, "$"))
    assert "regex filter" in (unsupported(spec) or "")
