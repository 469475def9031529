"""Multi-value string dimensions (issue 16): JSON arrays ingested end to end, checked against
DuckDB computing the same rollup over the same lines; and the one-string form's round trip."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.spark import SpecError, parse_spec
from shuffled.spark.rows.multivalue import decode, encode, has_multi
from tests.helpers.ingestion import ingest_alone, read_output, spark  # noqa: F401  (fixtures)

HOUR = 3_600_000
BASE = 1_519_862_400_000  # 2018-03-01T00:00:00Z
POOL = ["a", "b", "B", "c", "é", "", None, "a"]


def test_one_string_form_round_trips_and_orders_arrays_element_wise() -> None:
    arrays: list[list[str | None] | None] = [
        ["a", "b"], ["a"], [None, "b"], ["a", None], ["", "q"], ["a\x01", ""], ["a", "b", "c"],
        ["ab"], ["a", "a"], None, [],
    ]
    enc = pa.array([encode(a) for a in arrays], pa.string())
    want = [None if not a or a == [None] else a for a in arrays]
    assert decode(enc).to_pylist() == want
    assert decode(enc.dictionary_encode()).to_pylist() == want
    assert has_multi(enc) and not has_multi(pa.array(["a", None, "b"]))
    # Element by element, a prefix first, nulls first (multi-values among themselves).
    multi = [a for a in arrays if a and len(a) > 1]
    by_encoding = sorted(multi, key=lambda a: encode(a) or "")
    assert by_encoding == sorted(multi, key=lambda a: [(x is not None, x or "") for x in a])


def test_multi_value_handling_is_parsed_and_refused_by_path() -> None:
    spec = _spec("/nowhere", {"type": "hashed", "numShards": 2})
    parsed = parse_spec(spec)
    assert [d.multi_value_handling for d in parsed.dimensions[:3]] == [
        "SORTED_ARRAY", "SORTED_SET", "ARRAY"]
    spec["spec"]["dataSchema"]["dimensionsSpec"]["dimensions"][1]["multiValueHandling"] = "SORTED"
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.path == "$.spec.dataSchema.dimensionsSpec.dimensions[1].multiValueHandling"


def _value(rng: random.Random) -> Any:
    kind = rng.random()
    if kind < 0.45:
        return [rng.choice(POOL) for _ in range(rng.randint(0, 4))]
    if kind < 0.75:
        return rng.choice([p for p in POOL if p is not None])
    if kind < 0.85:
        return None
    if kind < 0.92:
        return '["a","b"]'  # a JSON string that looks like an array: one value
    return 7


def _lines(n: int, seed: int = 16) -> tuple[list[str], int]:
    """JSON lines (each tags value under three fields, one per multiValueHandling) and how
    many of them are unparseable (U+0000 in a value)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        v = _value(rng)
        row: dict[str, Any] = {"ts": BASE + rng.randrange(2 * 24 * HOUR), "country": rng.choice("XYZ"),
                               "n": rng.randint(0, 9)}
        if i % 17 != 5:  # some rows lack the fields altogether
            row.update(tags=v, stags=v, atags=v)
        lines.append(json.dumps(row))
    bad = [{"ts": BASE, "country": "X", "n": 1, "tags": ["a\u0000b", "c"], "stags": [], "atags": []},
           {"ts": BASE, "country": "X", "n": 1, "tags": "x", "stags": "x\u0000", "atags": "x"}]
    return lines + [json.dumps(b) for b in bad], len(bad)


def _spec(base_dir: str, partitions: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "mv",
                "timestampSpec": {"column": "ts", "format": "millis"},
                "dimensionsSpec": {"dimensions": [
                    "tags", {"name": "stags", "multiValueHandling": "SORTED_SET"},
                    {"name": "atags", "type": "string", "multiValueHandling": "array"}, "country"]},
                "metricsSpec": [{"type": "count", "name": "count"},
                                {"type": "longSum", "name": "n", "fieldName": "n"}],
                "granularitySpec": {"segmentGranularity": "day", "queryGranularity": "hour"},
            },
            "ioConfig": {"type": "index_parallel",
                         "inputSource": {"type": "local", "baseDir": base_dir, "filter": "*.json"},
                         "inputFormat": {"type": "json"}},
            "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                             "maxNumConcurrentSubTasks": 2, "partitionsSpec": partitions},
        },
    }


#: Each field's multi-value as Druid stores it, in DuckDB: an array after its handling
#: ([] and [null] are null), a single value a one-element list.
_LIST = "from_json(j->'{f}', '[\"VARCHAR\"]')"
_HANDLED = {
    "tags": f"list_sort({_LIST}, 'ASC', 'NULLS FIRST')",
    "stags": (f"CASE WHEN len(list_filter({_LIST}, lambda x: x IS NULL)) > 0 "
              f"THEN list_prepend(NULL, list_sort(list_distinct({_LIST}))) "
              f"ELSE list_sort(list_distinct({_LIST})) END"),
    "atags": _LIST,
}


def _duckdb_rollup(lines: list[str]) -> list[tuple[Any, ...]]:
    import duckdb

    cols = []
    for f, handled in _HANDLED.items():
        h = handled.format(f=f)
        cols.append(f"""CASE WHEN json_type(j->'{f}') IS NULL OR json_type(j->'{f}') = 'NULL' THEN NULL
                             WHEN json_type(j->'{f}') <> 'ARRAY' THEN [j->>'{f}']
                             WHEN len({h}) = 0 OR (len({h}) = 1 AND {h}[1] IS NULL) THEN NULL
                             ELSE {h} END AS {f}""")
    with duckdb.connect() as con:
        con.register("input_lines", pa.table({"line": lines}))
        return con.execute(f"""
            WITH parsed AS (SELECT line::JSON AS j FROM input_lines),
                 rows AS (SELECT CAST(j->>'ts' AS BIGINT) AS ts, j->>'country' AS country,
                                 CAST(j->>'n' AS BIGINT) AS n, {", ".join(cols)}
                          FROM parsed
                          WHERE NOT contains(CAST(j AS VARCHAR), '\\u0000'))
            SELECT ts - ts % {HOUR}, tags, stags, atags, country, count(*), sum(n)
            FROM rows GROUP BY ALL""").fetchall()


def _key(row: tuple[Any, ...]) -> str:
    return json.dumps(row, ensure_ascii=False)


def test_json_arrays_roll_up_as_multi_value_dimensions_like_duckdb(spark: Any, tmp_path: Path) -> None:
    lines, bad = _lines(600)
    (tmp_path / "in").mkdir()
    half = len(lines) // 2
    (tmp_path / "in/a.json").write_text("\n".join(lines[:half]) + "\n")
    (tmp_path / "in/b.json").write_text("\n".join(lines[half:]) + "\n")
    spec = _spec(str(tmp_path / "in"), {"type": "hashed", "numShards": 3,
                                        "partitionDimensions": ["tags"]})
    result = ingest_alone(spec, tmp_path)
    _manifest, out = read_output(tmp_path / "out", "mv")
    for f in ("tags", "stags", "atags"):
        assert out.schema.field(f).type == pa.list_(pa.string())
    assert out.schema.field("country").type == pa.string()
    ms = pc.cast(pc.cast(out.column("__time"), pa.timestamp("ms")), pa.int64()).to_pylist()
    rows = out.drop_columns(["__time"]).to_pylist()
    got = sorted(((t, r["tags"], r["stags"], r["atags"], r["country"], r["count"], r["n"])
                  for t, r in zip(ms, rows)), key=_key)
    assert got == sorted(_duckdb_rollup(lines), key=_key)
    # Hashed on the whole array: every (hour, tags) lies in one partition of its day.
    where: dict[str, set[str]] = {}
    for t, r in zip(ms, rows):
        where.setdefault(json.dumps([t - t % (24 * HOUR), r["tags"]]), set()).add(r["__seg"])
    assert all(len(s) == 1 for s in where.values())
    assert len({r["__seg"] for r in rows}) > 1
    stats = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    assert stats["unparseable"] == bad and stats["processed"] == len(lines) - bad
    phase = result.report["phases"]["partialSegmentGeneration"]
    assert phase["multiValueDimensions"] == ["atags", "stags", "tags"]


def test_range_partitioning_refuses_multi_value_rows_of_its_dimension(spark: Any, tmp_path: Path) -> None:
    lines = [json.dumps({"ts": BASE + i, "country": "X", "n": 1, "tags": v, "stags": v, "atags": v})
             for i, v in enumerate([["a", "b"], "a", ["c"], ["b", "b"], None])]
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.json").write_text("\n".join(lines) + "\n")
    spec = _spec(str(tmp_path / "in"), {"type": "single_dim", "partitionDimension": "tags",
                                        "targetRowsPerSegment": 2})
    result = ingest_alone(spec, tmp_path)
    stats = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    assert stats["unparseable"] == 2 and stats["processed"] == 3
    _manifest, out = read_output(tmp_path / "out", "mv")
    assert sorted(out.column("tags").to_pylist(), key=lambda v: (v is not None, v or "")) == [None, "a", "c"]
    assert out.schema.field("atags").type == pa.string()  # no multi-value reached phase 2


def test_native_reader_declines_a_list_dimension_and_says_why(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from shuffled.spark.phase1.native.reader import SplitSizing, plan_native
    from shuffled.spark.spec.model import PartitionPlan

    pq.write_table(pa.table({"ts": [BASE], "country": ["X"], "n": [1], "tags": [["a", "b"]],
                             "stags": ["a"], "atags": ["a"]}), tmp_path / "a.parquet")
    spec = _spec(str(tmp_path), {"type": "hashed", "numShards": 2})
    spec["spec"]["ioConfig"]["inputSource"]["filter"] = "*.parquet"
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": "parquet"}
    why = plan_native(parse_spec(spec), PartitionPlan("hashed", (), num_shards=2),
                      [str(tmp_path / "a.parquet")], SplitSizing(1 << 20, 0, 2, 2))
    assert isinstance(why, str) and "dimension tags is a list (multi-value" in why


def test_parquet_list_dimension_goes_through_the_jvm_like_duckdb(spark: Any, tmp_path: Path) -> None:
    import duckdb
    import pyarrow.parquet as pq

    rng = random.Random(5)
    n = 300
    table = pa.table({
        "ts": pa.array([BASE + rng.randrange(6 * HOUR) for _ in range(n)], pa.int64()),
        "country": [rng.choice("XY") for _ in range(n)],
        "n": pa.array([rng.randint(0, 9) for _ in range(n)], pa.int64()),
        "tags": pa.array([None if rng.random() < 0.1 else
                          [rng.choice(["a", "b", "c", None]) for _ in range(rng.randint(0, 3))]
                          for _ in range(n)], pa.list_(pa.string())),
    })
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in/a.parquet")
    spec = _spec(str(tmp_path / "in"), {"type": "hashed", "numShards": 2})
    spec["spec"]["dataSchema"]["dimensionsSpec"]["dimensions"] = ["tags", "country"]
    spec["spec"]["ioConfig"]["inputSource"]["filter"] = "*.parquet"
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": "parquet"}
    result = ingest_alone(spec, tmp_path)
    phase = result.report["phases"]["partialSegmentGeneration"]
    assert phase["reader"] == "jvm" and "dimension tags is a list" in phase["readerReason"]
    _manifest, out = read_output(tmp_path / "out", "mv")
    ms = pc.cast(pc.cast(out.column("__time"), pa.timestamp("ms")), pa.int64()).to_pylist()
    got = sorted(((t, r["tags"], r["country"], r["count"], r["n"])
                  for t, r in zip(ms, out.drop_columns(["__time"]).to_pylist())), key=_key)
    h = "list_sort(tags, 'ASC', 'NULLS FIRST')"
    with duckdb.connect() as con:
        con.register("input_rows", table)
        want = con.execute(f"""
            SELECT ts - ts % {HOUR},
                   CASE WHEN len({h}) = 0 OR (len({h}) = 1 AND {h}[1] IS NULL) THEN NULL ELSE {h} END,
                   country, count(*), sum(n)
            FROM input_rows GROUP BY ALL""").fetchall()
    assert got == sorted(want, key=_key)
