"""transformSpec end to end: Druid's own transform tutorial, and every expression function and
filter type against DuckDB over the same rows (one Spark session, small inputs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.protocol import parse_instant
from tests.helpers.ingestion import ingest_alone, read_output, spark  # noqa: F401  (fixtures)
from tests.helpers.transform_cases import EXPRESSIONS, FILTERS

ROOT = Path(__file__).resolve().parents[3]
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


@pytest.fixture(scope="module")
def frame(spark: Any) -> Any:
    from shuffled.spark.driver.sparksession import JOB_CONF

    spark.conf.set("spark.sql.session.timeZone", JOB_CONF["spark.sql.session.timeZone"])
    n = len(ROWS["s"])
    rows = [(i, *(ROWS[k][i] for k in ("s", "n", "d", "t", "ts", "dmy", "ms"))) for i in range(n)]
    return spark.createDataFrame(rows, SCHEMA)


def _columns(df: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from shuffled.spark.phase1.jvm.sqlexpr import LONG, Val, input_val

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
    from shuffled.spark.phase1.jvm.sqlexpr import Translator, as_value
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

    from shuffled.spark.phase1.jvm.filters import filter_column
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
