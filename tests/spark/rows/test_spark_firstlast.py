"""First/last aggregators (issue 16) end to end against DuckDB's arg_min/arg_max over the same
lines, with ties on time, null values, null times and a separate timeColumn; rows split over
tasks and flushes so partials combine in phase 1 and phase 2."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark import parse_spec
from shuffled.spark.rows.firstlast import hidden_time
from tests.helpers.ingestion import ingest_alone, read_output, spark  # noqa: F401  (fixtures)

HOUR = 3_600_000
BASE = 1_519_862_400_000  # 2018-03-01T00:00:00Z

#: (metric, Druid type, field, extra aggregator fields)
METRICS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("lf", "longFirst", "lv", {}), ("ll", "longLast", "lv", {}),
    ("df", "doubleFirst", "dv", {}), ("dl", "doubleLast", "dv", {}),
    ("ff", "floatFirst", "dv", {}), ("fl", "floatLast", "dv", {}),
    ("sf", "stringFirst", "sv", {}), ("sl", "stringLast", "sv", {"maxStringBytes": 3}),
    ("lf2", "longFirst", "lv", {"timeColumn": "t2"}), ("sl2", "stringLast", "sv", {"timeColumn": "t2"}),
]


def _lines(n: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        # Whole seconds in a few hours: many rows share a time (ties broken by value).
        ms = BASE + 1000 * rng.randrange(4 * 3600 // 40) * 40
        row: dict[str, Any] = {
            "ts": ms, "country": rng.choice("XYZ"),
            "lv": rng.choice([None, *range(-3, 6)]), "dv": rng.choice([None, 0.5, -1.25, 2.0, 1e-3]),
            "sv": rng.choice([None, "", "apple", "apricot", "banana", "Zed", "é-acute"]),
            "t2": rng.choice([None, "junk", *range(0, 50)]),
        }
        out.append(json.dumps(row))
    return out


def _spec(base_dir: str) -> dict[str, Any]:
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "fl",
                "timestampSpec": {"column": "ts", "format": "millis"},
                "dimensionsSpec": {"dimensions": ["country"]},
                "metricsSpec": [{"type": "count", "name": "count"}]
                + [{"type": t, "name": m, "fieldName": f, **x} for m, t, f, x in METRICS],
                "granularitySpec": {"segmentGranularity": "hour", "queryGranularity": "hour"},
            },
            "ioConfig": {"type": "index_parallel",
                         "inputSource": {"type": "local", "baseDir": base_dir, "filter": "*.json"},
                         "inputFormat": {"type": "json"}},
            "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                             "maxNumConcurrentSubTasks": 2, "maxRowsInMemory": 1000,
                             "maxBytesInMemory": 65536,
                             "partitionsSpec": {"type": "hashed", "numShards": 2}},
        },
    }


def _duckdb(lines: list[str]) -> list[tuple[Any, ...]]:
    """Per (hour, country): each metric as arg_min/arg_max of the (truncated, typed) value by
    (time, value), nulls first among values; a row without a time is never picked."""
    import duckdb

    typed = {"lv": "CAST(j->>'lv' AS BIGINT)", "dv": "CAST(j->>'dv' AS DOUBLE)", "sv": "j->>'sv'"}
    aggs = []
    for m, kind, f, extra in METRICS:
        v = typed[f]
        if kind.startswith("float"):
            v = f"CAST({v} AS FLOAT)"
        if kind.startswith("string"):
            v = f"left({v}, {extra.get('maxStringBytes', 1024)})"
        t = "TRY_CAST(j->>'t2' AS BIGINT)" if extra.get("timeColumn") else "CAST(j->>'ts' AS BIGINT)"
        if kind.endswith("First"):
            pick = f"arg_min_null({v}, ({t} IS NULL, {t}, {v} IS NOT NULL, {v}))"
        else:
            pick = f"arg_max_null({v}, ({t} IS NOT NULL, {t}, {v} IS NOT NULL, {v}))"
        aggs.append(f"CASE WHEN count({t}) = 0 THEN NULL ELSE {pick} END")
    with duckdb.connect() as con:
        con.register("input_lines", pa.table({"line": lines}))
        return con.execute(f"""
            WITH parsed AS (SELECT line::JSON AS j FROM input_lines)
            SELECT CAST(j->>'ts' AS BIGINT) // {HOUR} * {HOUR}, j->>'country', count(*), {", ".join(aggs)}
            FROM parsed GROUP BY ALL""").fetchall()


def test_first_last_metrics_parse_with_their_time_columns() -> None:
    spec = parse_spec(_spec("/nowhere"))
    by_name = {m.name: m for m in spec.metrics}
    assert by_name["lf"].time_column == "__time" and by_name["lf2"].time_column == "t2"
    assert by_name["sl"].max_string_bytes == 3 and by_name["sf"].max_string_bytes == 1024
    assert "t2" in spec.input_fields


def test_first_last_equal_duckdb_arg_min_arg_max(spark: Any, tmp_path: Path) -> None:
    lines = _lines(5000)
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.json").write_text("\n".join(lines[:2500]) + "\n")
    (tmp_path / "in/b.json").write_text("\n".join(lines[2500:]) + "\n")
    result = ingest_alone(_spec(str(tmp_path / "in")), tmp_path)
    _manifest, out = read_output(tmp_path / "out", "fl")
    assert not any(c.startswith(hidden_time("")) for c in out.column_names)
    assert out.schema.field("ff").type == pa.float32() and out.schema.field("sf").type == pa.string()
    ms = pc.cast(pc.cast(out.column("__time"), pa.timestamp("ms")), pa.int64()).to_pylist()
    names = ["country", "count", *(m for m, *_ in METRICS)]
    got = sorted(((t, *(r[k] for k in names)) for t, r in zip(ms, out.select(names).to_pylist())),
                 key=repr)
    assert got == sorted(_duckdb(lines), key=repr)
    phase1 = result.report["phases"]["partialSegmentGeneration"]
    assert phase1["rowsShipped"] > len(got)  # several partials per key: phase 2 combined them
    assert phase1["reader"] == "native"  # JSON first/last: the native text reader


def test_native_reader_declines_first_last_and_says_why(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from shuffled.spark.phase1.native.reader import SplitSizing, plan_native
    from shuffled.spark.spec.model import PartitionPlan

    pq.write_table(pa.table({"ts": [BASE], "country": ["X"], "lv": [1], "dv": [1.0], "sv": ["a"],
                             "t2": [1]}), tmp_path / "a.parquet")
    spec = _spec(str(tmp_path))
    spec["spec"]["ioConfig"]["inputSource"]["filter"] = "*.parquet"
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": "parquet"}
    why = plan_native(parse_spec(spec), PartitionPlan("hashed", (), num_shards=2),
                      [str(tmp_path / "a.parquet")], SplitSizing(1 << 20, 0, 2, 2))
    assert isinstance(why, str) and why.startswith("first/last aggregators (lf, ll,")
