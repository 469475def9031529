"""transformSpec end to end: Druid's own transform tutorial, and every expression function and
filter type against DuckDB over the same rows (one Spark session, small inputs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from spark_conftest_helpers import ingest_alone, read_output, spark  # noqa: F401  (fixtures)

from shuffled.protocol import parse_instant

ROOT = Path(__file__).resolve().parent.parent
DRUID = ROOT / "tests/data/druid"


def _rows(out: pa.Table) -> list[dict[str, Any]]:
    ms = pc.cast(pc.cast(out.column("__time"), pa.timestamp("ms")), pa.int64()).to_pylist()
    rows = [{**r, "__time": t} for t, r in zip(ms, out.drop_columns(["__seg"]).to_pylist())]
    return sorted(rows, key=lambda r: r["__time"])


def test_druid_transform_tutorial_publishes_the_documented_rows(spark: Any, tmp_path: Path) -> None:
    spec = json.loads((DRUID / "transform/transform-index.json").read_text())
    spec["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(DRUID / "transform")
    result = ingest_alone(spec, tmp_path)
    _manifest, out = read_output(tmp_path / "out", "transform-tutorial")
    documented = json.loads((DRUID / "transform/expected-rows.json").read_text())
    for row in documented:
        row["__time"] = parse_instant(row["__time"])
    assert _rows(out) == documented
    stats = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    assert stats["processed"] == 3 and stats["thrownAway"] == 1 and stats["unparseable"] == 0
    phase = result.report["phases"]["partialSegmentGeneration"]
    assert phase["reader"] == "native" and "JSON" in phase["readerReason"]


# --- every function and filter type against DuckDB -------------------------------------

ROWS = {
    "s": ["Hello World", "abc", "", None, "x%y_z", "  pad  "],
    "n": [7, -3, 0, None, 100, -3037000500],
    "d": [2.5, -0.5, 0.0, None, 1000.0, -7.25],
    "t": ["12", "3.5", "abc", None, "-4", "1e3"],
    "ts": ["2018-01-01T07:01:35Z", "2019-06-15T23:59:59Z", "garbage", None, "1969-12-31T23:00:00Z",
           "2020-02-29T12:00:00Z"],
    "dmy": ["01/02/2018 10:30", "31/12/1999 23:59", "2018-01-01", None, "29/02/2020 00:00", "x"],
    "ms": [1514790095123, 1560643199000, 0, None, -3600000, 1582977600000],
}
SCHEMA = "id bigint, s string, n bigint, d double, t string, ts string, dmy string, ms bigint"
# Druid's asLong of a string: a long if it is one, else the double truncated toward zero.
TRY_LONG = ("CASE WHEN regexp_full_match({x}, '-?[0-9]+') THEN TRY_CAST({x} AS BIGINT) "
            "ELSE CAST(trunc(TRY_CAST({x} AS DOUBLE)) AS BIGINT) END")
D_BY_ZERO = "CASE WHEN d > 0 THEN 'inf'::DOUBLE WHEN d < 0 THEN '-inf'::DOUBLE WHEN d = 0 THEN 'nan'::DOUBLE END"

#: (Druid expression, DuckDB SQL computing what Druid documents for it). Every function of
#: spec.expr.FUNCTIONS appears at least once (test_every_function_is_tested checks).
EXPRESSIONS: list[tuple[str, str]] = [
    ("n + 2", "n + 2"), ("n - d", "n - d"), ("n * 3", "n * 3"), ("d * 2", "d * 2"),
    ("n / 2", "n // 2"), ("n / 0", "CAST(NULL AS BIGINT)"), ("d / 0", D_BY_ZERO),
    ("n % 4", "n % 4"), ("d % 2", "d % 2.0"), ("n ^ 2", "TRY_CAST(pow(n, 2) AS BIGINT)"),
    ("d ^ 2", "pow(d, 2)"), ("-n", "-n"), ("-d", "-d"), ("2 + 3 * 4 ^ 2", "50"),
    ("-2 ^ 2", "4"), ("t * 2", "TRY_CAST(t AS DOUBLE) * 2"), ("t + 1", "TRY_CAST(t AS DOUBLE) + 1"),
    ("s + s", "s || s"), ("n > 0 && d > 0", "CAST((n > 0) AND (d > 0) AS BIGINT)"),
    ("n > 0 || s == 'abc'", "CAST((n > 0) OR (s = 'abc') AS BIGINT)"),
    ("n > 0 || d > 0 && s == 'abc'", "CAST(((n > 0) OR (d > 0)) AND (s = 'abc') AS BIGINT)"),
    ("!(n > 0)", "CAST(NOT (n > 0) AS BIGINT)"), ("!s", "CAST(NOT (lower(s) = 'true') AS BIGINT)"),
    ("n == 7", "CAST(n = 7 AS BIGINT)"), ("n != d", "CAST(n != d AS BIGINT)"),
    ("s < 'b'", "CAST(s < 'b' AS BIGINT)"), ("s >= ''", "CAST(s >= '' AS BIGINT)"),
    ("t <= 5", "CAST(TRY_CAST(t AS DOUBLE) <= 5 AS BIGINT)"),
    ("concat('x-', s, n)", "'x-' || s || CAST(n AS VARCHAR)"),
    ("concat(s, d)", "s || CAST(d AS VARCHAR)"),
    ("substring(s, 1, 3)", "CASE WHEN 1 < length(s) THEN substr(s, 2, 3) END"),
    ("substring(s, 2, -1)", "CASE WHEN 2 < length(s) THEN substr(s, 3) END"),
    ("lower(s)", "lower(s)"), ("upper(s)", "upper(s)"), ("strlen(s)", "CAST(length(s) AS BIGINT)"),
    ("trim(s)", "trim(s, ' ')"), ("replace(s, 'l', 'L')", "replace(s, 'l', 'L')"),
    ("nvl(s, 'none')", "coalesce(s, 'none')"), ("nvl(n, d)", "coalesce(CAST(n AS DOUBLE), d)"),
    ("isnull(s)", "CAST(s IS NULL AS BIGINT)"), ("notnull(n)", "CAST(n IS NOT NULL AS BIGINT)"),
    ("abs(n)", "abs(n)"), ("abs(d)", "abs(d)"),
    ("if(n > 0, 'pos', 'nonpos')", "CASE WHEN n > 0 THEN 'pos' ELSE 'nonpos' END"),
    ("if(s, 1, d)", "CASE WHEN lower(s) = 'true' THEN 1.0 ELSE d END"),
    ("case_searched(n > 5, 'big', n > 0, 'small', 'other')",
     "CASE WHEN n > 5 THEN 'big' WHEN n > 0 THEN 'small' ELSE 'other' END"),
    ("case_searched(n > 5, n)", "CASE WHEN n > 5 THEN n END"),
    ("case_simple(s, 'abc', 1, 'Hello World', 2, 0)",
     "CASE WHEN s = 'abc' THEN 1 WHEN s = 'Hello World' THEN 2 ELSE 0 END"),
    ("like(s, '%o%')", "CAST(s LIKE '%o%' AS BIGINT)"),
    ("like(s, 'x\\\\%y%', '\\\\')", "CAST(s LIKE 'x\\%y%' ESCAPE '\\' AS BIGINT)"),
    ("like(s, '_bc')", "CAST(s LIKE '_bc' AS BIGINT)"),
    ("regexp_like(s, 'o W')", "CAST(regexp_matches(s, 'o W') AS BIGINT)"),
    ("regexp_extract(s, '([a-z]+)', 1)",
     "CASE WHEN regexp_matches(s, '([a-z]+)') THEN regexp_extract(s, '([a-z]+)', 1) END"),
    ("regexp_extract(s, 'l+')", "CASE WHEN regexp_matches(s, 'l+') THEN regexp_extract(s, 'l+') END"),
    ("timestamp_floor(ms, 'PT1H')", "epoch_ms(date_trunc('hour', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'PT15M')", "epoch_ms(time_bucket(INTERVAL 15 MINUTE, epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P1D')", "epoch_ms(date_trunc('day', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P2D')",
     "epoch_ms(time_bucket(INTERVAL 2 DAY, epoch_ms(ms), TIMESTAMP '1970-01-01'))"),
    ("timestamp_floor(ms, 'P1W')", "epoch_ms(date_trunc('week', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P1M')", "epoch_ms(date_trunc('month', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P3M')", "epoch_ms(date_trunc('quarter', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P1Y')", "epoch_ms(date_trunc('year', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'PT1H', 1800000, 'UTC')",
     "epoch_ms(time_bucket(INTERVAL 1 HOUR, epoch_ms(ms), TIMESTAMP '1970-01-01 00:30:00'))"),
    ("timestamp_floor(__time, 'PT1M')", "epoch_ms(date_trunc('minute', epoch_ms(ms)))"),
    ("timestamp_parse(ts)", "epoch_ms(try_strptime(ts, '%Y-%m-%dT%H:%M:%SZ'))"),
    ("timestamp_parse(dmy, 'dd/MM/yyyy HH:mm')", "epoch_ms(try_strptime(dmy, '%d/%m/%Y %H:%M'))"),
    ("timestamp_format(ms)", "strftime(epoch_ms(ms), '%Y-%m-%dT%H:%M:%S.%gZ')"),
    ("timestamp_format(ms, 'yyyy-MM-dd HH')", "strftime(epoch_ms(ms), '%Y-%m-%d %H')"),
    ("cast(t, 'LONG')", TRY_LONG.format(x="t")), ("cast(d, 'LONG')", "CAST(trunc(d) AS BIGINT)"),
    ("cast(n, 'STRING')", "CAST(n AS VARCHAR)"), ("cast(t, 'DOUBLE')", "TRY_CAST(t AS DOUBLE)"),
    ("cast(n, 'FLOAT')", "CAST(n AS DOUBLE)"),
]

#: (filter JSON, DuckDB condition); a row is kept when the condition is true (not null).
FILTERS: list[tuple[dict[str, Any], str]] = [
    ({"type": "selector", "dimension": "s", "value": "abc"}, "s = 'abc'"),
    ({"type": "selector", "dimension": "s", "value": None}, "s IS NULL"),
    ({"type": "selector", "dimension": "s", "value": ""}, "s = ''"),
    ({"type": "selector", "dimension": "n", "value": "7"}, "n = 7"),
    ({"type": "selector", "dimension": "d", "value": "2.5"}, "d = 2.5"),
    ({"type": "selector", "dimension": "n", "value": "x"}, "false"),
    ({"type": "equality", "column": "n", "matchValueType": "LONG", "matchValue": 7}, "n = 7"),
    ({"type": "equality", "column": "s", "matchValueType": "STRING", "matchValue": "abc"}, "s = 'abc'"),
    ({"type": "equality", "column": "t", "matchValueType": "DOUBLE", "matchValue": 3.5},
     "TRY_CAST(t AS DOUBLE) = 3.5"),
    ({"type": "in", "dimension": "s", "values": ["abc", "", None]}, "s IN ('abc', '') OR s IS NULL"),
    ({"type": "in", "dimension": "n", "values": ["7", "100"]}, "n IN (7, 100)"),
    ({"type": "bound", "dimension": "s", "lower": "a", "upper": "b"}, "s >= 'a' AND s <= 'b'"),
    ({"type": "bound", "dimension": "t", "lower": "0", "upper": "12", "upperStrict": True,
      "ordering": "numeric"}, "TRY_CAST(t AS DOUBLE) >= 0 AND TRY_CAST(t AS DOUBLE) < 12"),
    ({"type": "range", "column": "n", "matchValueType": "LONG", "lower": 0, "lowerOpen": True},
     "n > 0"),
    ({"type": "range", "column": "s", "matchValueType": "STRING", "upper": "b"}, "s <= 'b'"),
    ({"type": "range", "column": "d", "matchValueType": "DOUBLE", "lower": -1, "upper": 2.5,
      "upperOpen": True}, "d >= -1 AND d < 2.5"),
    ({"type": "like", "dimension": "s", "pattern": "%o%"}, "s LIKE '%o%'"),
    ({"type": "like", "dimension": "s", "pattern": "x!%y%", "escape": "!"}, "s LIKE 'x!%y%' ESCAPE '!'"),
    ({"type": "regex", "dimension": "s", "pattern": "^[a-z]+$"}, "regexp_matches(s, '^[a-z]+$')"),
    ({"type": "null", "column": "s"}, "s IS NULL"),
    ({"type": "interval", "dimension": "__time",
      "intervals": ["2018-01-01/2019-07-01", "1969-01-01/1970-01-01"]},
     "(ms >= 1514764800000 AND ms < 1561939200000) OR (ms >= -31536000000 AND ms < 0)"),
    ({"type": "true"}, "true"), ({"type": "false"}, "false"),
    ({"type": "and", "fields": [{"type": "selector", "dimension": "s", "value": "abc"},
                                {"type": "bound", "dimension": "n", "lower": "-5", "ordering": "numeric"}]},
     "s = 'abc' AND n >= -5"),
    ({"type": "or", "fields": [{"type": "selector", "dimension": "s", "value": "abc"},
                               {"type": "null", "column": "n"}]}, "s = 'abc' OR n IS NULL"),
    ({"type": "not", "field": {"type": "selector", "dimension": "s", "value": "abc"}}, "NOT (s = 'abc')"),
    ({"type": "expression", "expression": "n > 0"}, "n > 0"),
]


@pytest.fixture(scope="module")
def frame(spark: Any) -> Any:
    from shuffled.spark.driver.sparksession import JOB_CONF

    spark.conf.set("spark.sql.session.timeZone", JOB_CONF["spark.sql.session.timeZone"])
    n = len(ROWS["s"])
    rows = [(i, *(ROWS[k][i] for k in ("s", "n", "d", "t", "ts", "dmy", "ms"))) for i in range(n)]
    return spark.createDataFrame(rows, SCHEMA)


def _columns(df: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from shuffled.spark.phase1.sqlexpr import LONG, Val, input_val

    cols = {f.name: input_val(F.col(f.name), f.dataType, f.name, "$") for f in df.schema.fields}
    cols["__time"] = Val(F.col("ms"), LONG)
    return cols


def _duckdb(exprs: list[str]) -> list[tuple[Any, ...]]:
    import duckdb

    con = duckdb.connect()
    con.register("input_rows", pa.table({"id": list(range(len(ROWS["s"]))), **ROWS}))
    con.execute("SET TimeZone = 'UTC'")
    select = ", ".join(f"({e}) AS c{i}" for i, e in enumerate(exprs))
    return con.execute(f"SELECT {select} FROM input_rows ORDER BY id").fetchall()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (a != a and b != b) or a == b or abs(a - b) <= 1e-9 * max(1.0, abs(a))
    return a == b and type(a) is type(b)


def test_expressions_equal_duckdb(frame: Any) -> None:
    from shuffled.spark.phase1.sqlexpr import Translator, as_value
    from shuffled.spark.spec.expr import parse_expr

    cols = _columns(frame)
    translate = Translator(cols, "$")
    out = [as_value(translate(parse_expr(e, "$"))).col.alias(f"c{i}") for i, (e, _) in enumerate(EXPRESSIONS)]
    got = [tuple(r) for r in frame.orderBy("id").select(*out).collect()]
    want = _duckdb([sql for _, sql in EXPRESSIONS])
    for row, (g, w) in enumerate(zip(got, want)):
        for i, (expr, sql) in enumerate(EXPRESSIONS):
            assert _same(g[i], w[i]), f"row {row}: {expr} gave {g[i]!r}, DuckDB {sql} gave {w[i]!r}"


def test_filters_equal_duckdb(frame: Any) -> None:
    from pyspark.sql import functions as F

    from shuffled.spark.phase1.filters import filter_column
    from shuffled.spark.spec.transform import parse_filter

    cols = _columns(frame)
    out = [F.coalesce(filter_column(parse_filter(f, "$"), cols, "$"), F.lit(False)).alias(f"c{i}")
           for i, (f, _) in enumerate(FILTERS)]
    got = [tuple(r) for r in frame.orderBy("id").select(*out).collect()]
    want = _duckdb([f"COALESCE({sql}, false)" for _, sql in FILTERS])
    assert got == want, [(FILTERS[i][0], [g[i] for g in got], [w[i] for w in want])
                         for i in range(len(FILTERS)) if [g[i] for g in got] != [w[i] for w in want]]


def test_every_function_and_filter_type_is_tested() -> None:
    from shuffled.spark.spec.expr import FUNCTIONS
    from shuffled.spark.spec.transform import FILTER_TYPES

    used = {name for name in FUNCTIONS if any(f"{name}(" in e for e, _ in EXPRESSIONS)}
    assert used == set(FUNCTIONS)
    assert {f["type"] for f, _ in FILTERS} == set(FILTER_TYPES)


def test_parquet_transforms_time_and_shadowing_equal_duckdb(spark: Any, tmp_path: Path) -> None:
    """Parquet input (the native reader declines: transformSpec), a __time transform, a
    shadowed dimension and a filter on a transform's output, rolled up; checked with DuckDB."""
    import duckdb
    import pyarrow.parquet as pq

    n = 400
    base = 1514764800000  # 2018-01-01
    table = pa.table({
        "ts": [base + i * 997_000 for i in range(n)],
        "country": [["fr", "de", None, "us"][i % 4] for i in range(n)],
        "qty": [i % 7 for i in range(n)],
        "price": [1.25 * (i % 5) for i in range(n)],
    })
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "part.parquet", row_group_size=100)
    spec = {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "tx",
                "timestampSpec": {"column": "ts", "format": "millis"},
                "dimensionsSpec": {"dimensions": ["country", {"name": "band", "type": "long"}]},
                "metricsSpec": [{"type": "count", "name": "rows"},
                                {"type": "doubleSum", "name": "revenue", "fieldName": "revenue"}],
                "granularitySpec": {"segmentGranularity": "day", "queryGranularity": "none"},
                "transformSpec": {
                    "transforms": [
                        {"type": "expression", "name": "__time", "expression": "timestamp_floor(__time, 'PT1H')"},
                        {"type": "expression", "name": "country", "expression": "upper(nvl(country, 'xx'))"},
                        {"type": "expression", "name": "band", "expression": "qty / 3"},
                        {"type": "expression", "name": "revenue", "expression": "qty * price"},
                    ],
                    "filter": {"type": "not", "field": {"type": "selector", "dimension": "country", "value": "DE"}},
                },
            },
            "ioConfig": {"type": "index_parallel",
                         "inputSource": {"type": "local", "baseDir": str(tmp_path / "in"), "filter": "*.parquet"},
                         "inputFormat": {"type": "parquet"}},
            "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                             "partitionsSpec": {"type": "hashed", "numShards": 2}},
        },
    }
    result = ingest_alone(spec, tmp_path)
    phase = result.report["phases"]["partialSegmentGeneration"]
    assert phase["reader"] == "jvm" and "transformSpec" in phase["readerReason"]
    _manifest, out = read_output(tmp_path / "out", "tx")
    got = sorted((r["__time"], r["country"], r["band"], r["rows"], round(r["revenue"], 9))
                 for r in _rows(out))
    con = duckdb.connect()
    con.register("input_rows", table)
    want = con.execute("""
        SELECT ts - ts % 3600000 AS t, upper(coalesce(country, 'xx')) AS c, qty // 3 AS band,
               count(*) AS rows, round(sum(qty * price), 9) AS revenue
        FROM input_rows WHERE upper(coalesce(country, 'xx')) != 'DE'
        GROUP BY ALL ORDER BY ALL""").fetchall()
    assert got == sorted(want)
    stats = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    assert stats["thrownAway"] == n // 4 and stats["processed"] == n - n // 4


# --- flattenSpec -----------------------------------------------------------------------

#: Each flattened field as DuckDB's JSON functions extract it (an independent JSONPath).
FLAT_DUCKDB = {
    "baz": "$.baz", "foo_bar": "$.foo.bar", "foo_other_bar": "$.foo.other.bar",
    "first_food": "$.thing.food[1]", "dim1": "$.dim1", "dim2": "$.dim2", "dim3": "$.dim3",
    "root-foo.bar": '$."foo.bar"', "hello-0": "$.hello[0]", "world-hey": "$.world[0].hey",
    "worldtree": "$.world[1].tree", "second-food": "$.thing.food[1]",
}


def test_flatten_example_equals_duckdb_json_paths(spark: Any, tmp_path: Path) -> None:
    import duckdb

    spec = json.loads((DRUID / "flatten/flatten-index.json").read_text())
    spec["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(DRUID / "flatten")
    result = ingest_alone(spec, tmp_path)
    _manifest, out = read_output(tmp_path / "out", "flatten-example")
    dims = list(FLAT_DUCKDB)
    got = sorted((tuple(r[k] for k in ["__time", *dims, "count", "path-metric-sum", "metrica"])
                  for r in _rows(out)), key=repr)
    lines = (DRUID / "flatten/flatten-data.json").read_text().splitlines()
    con = duckdb.connect()
    con.register("input_rows", pa.table({"line": lines}))
    extract = ", ".join(f"json_extract_string(line, '{p}') AS \"{d}\"" for d, p in FLAT_DUCKDB.items())
    want = con.execute(f"""
        WITH flat AS (SELECT epoch_ms(CAST(json_extract_string(line, '$.timestamp') AS TIMESTAMP)) AS ms,
                             {extract},
                             CAST(json_extract_string(line, '$.nestmet.val') AS BIGINT) AS pm,
                             CAST(json_extract_string(line, '$.metrica') AS BIGINT) AS metrica
                      FROM input_rows)
        SELECT ms - ms % 3600000, {", ".join(f'"{d}"' for d in dims)}, count(*), sum(pm), sum(metrica)
        FROM flat GROUP BY ALL""").fetchall()
    assert got == sorted(want, key=repr)
    assert len(got) == 3  # the first two records roll up into one row
    assert result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]["processed"] == 4
