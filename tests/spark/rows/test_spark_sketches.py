"""Sketch metrics (issue 16) end to end: each rolled-up row's HLL, theta and quantiles sketch,
deserialized with DataSketches, against DuckDB's exact distinct counts and quantiles over the
same lines; rows split over tasks and flushes so sketches are merged in both phases."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.spark import SpecError, parse_spec, run_ingestion
from tests.helpers.ingestion import ingest_alone, read_output, spark, start_daemon  # noqa: F401  (fixtures)

ds = pytest.importorskip("datasketches")

HOUR = 3_600_000
BASE = 1_519_862_400_000  # 2018-03-01T00:00:00Z


def _lines(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [json.dumps({"ts": BASE + rng.randrange(3 * HOUR), "country": rng.choice("XY"),
                        "user": rng.choice([None, *(f"u{i}" for i in range(400))]),
                        "latency": rng.choice([None, rng.random() * 100, rng.randrange(50)])})
            for _ in range(n)]


def _spec(base_dir: str) -> dict[str, Any]:
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "sk",
                "timestampSpec": {"column": "ts", "format": "millis"},
                "dimensionsSpec": {"dimensions": ["country"]},
                "metricsSpec": [
                    {"type": "count", "name": "count"},
                    {"type": "HLLSketchBuild", "name": "users_hll", "fieldName": "user", "lgK": 11,
                     "stringEncoding": "UTF8",
                     "tgtHllType": "HLL_8"},
                    {"type": "thetaSketch", "name": "users_theta", "fieldName": "user", "size": 4096},
                    {"type": "quantilesDoublesSketch", "name": "latency_q", "fieldName": "latency", "k": 64},
                ],
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


def test_sketch_parameters_are_parsed_and_refused_by_path() -> None:
    spec = parse_spec(_spec("/nowhere"))
    sizes = {m.name: (m.sketch_size, m.hll_type) for m in spec.metrics}
    assert sizes["users_hll"] == (11, "HLL_8") and sizes["users_theta"][0] == 12
    assert sizes["latency_q"][0] == 64
    bad = _spec("/nowhere")
    bad["spec"]["dataSchema"]["metricsSpec"][2]["size"] = 1000
    with pytest.raises(SpecError) as info:
        parse_spec(bad)
    assert info.value.path == "$.spec.dataSchema.metricsSpec[2].size"


def test_sketches_agree_with_duckdb(spark: Any, tmp_path: Path) -> None:
    import duckdb

    lines = _lines(4000)
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.json").write_text("\n".join(lines[:2000]) + "\n")
    (tmp_path / "in/b.json").write_text("\n".join(lines[2000:]) + "\n")
    result = ingest_alone(_spec(str(tmp_path / "in")), tmp_path)
    _manifest, out = read_output(tmp_path / "out", "sk")
    assert out.schema.field("users_hll").type == pa.binary()
    ms = pc.cast(pc.cast(out.column("__time"), pa.timestamp("ms")), pa.int64()).to_pylist()
    got = {(t, r["country"]): r for t, r in zip(ms, out.to_pylist())}
    with duckdb.connect() as con:
        con.register("input_lines", pa.table({"line": lines}))
        want = con.execute(f"""
            WITH p AS (SELECT line::JSON AS j FROM input_lines)
            SELECT CAST(j->>'ts' AS BIGINT) // {HOUR} * {HOUR}, j->>'country', count(*),
                   count(DISTINCT j->>'user'), count(j->>'latency'),
                   min(CAST(j->>'latency' AS DOUBLE)), max(CAST(j->>'latency' AS DOUBLE)),
                   quantile_disc(CAST(j->>'latency' AS DOUBLE), 0.5), list(j->>'user')
            FROM p GROUP BY ALL""").fetchall()
    assert len(got) == len(want)
    for t, country, count, users, n, lo, hi, median, values in want:
        row = got[(t, country)]
        assert row["count"] == count
        # Phase 2's union of the partial sketches against one sketch built directly from
        # every value: theta (exact mode here) gives the same estimate; HLL's union may
        # promote a list-mode sketch to an HLL array (another estimator), so its estimate
        # lies within the direct sketch's 2-sigma bounds rather than on it.
        one, theta = ds.hll_sketch(11, ds.tgt_hll_type.HLL_8), ds.update_theta_sketch(12)
        for v in values:
            if v is not None:
                one.update(v)
                theta.update(v)
        stored = ds.hll_sketch.deserialize(row["users_hll"])
        assert one.get_lower_bound(2) <= stored.get_estimate() <= one.get_upper_bound(2)
        assert ds.compact_theta_sketch.deserialize(row["users_theta"]).get_estimate() == \
            theta.get_estimate()
        hll = ds.hll_sketch.deserialize(row["users_hll"])
        assert hll.lg_config_k == 11  # the exact count within the sketch's own 3-sigma bounds
        assert hll.get_lower_bound(3) <= users <= hll.get_upper_bound(3)
        assert ds.compact_theta_sketch.deserialize(row["users_theta"]).get_estimate() == users
        q = ds.quantiles_doubles_sketch.deserialize(row["latency_q"])
        assert q.k == 64 and q.n == n and (q.get_min_value(), q.get_max_value()) == (lo, hi)
        assert abs(q.get_rank(median) - 0.5) <= 0.05
    phase1 = result.report["phases"]["partialSegmentGeneration"]
    assert phase1["rowsShipped"] > len(got)  # partial sketches were merged in phase 2


def test_native_and_jvm_readers_build_the_same_sketches(spark: Any, tmp_path: Path) -> None:
    """Parquet input read natively (pyarrow on the executors) or through the JVM: the same
    rows, counts and theta estimates, HLL estimates within each other's bounds, the same
    quantile counts and extremes; a sketch over a non-string field stays on the JVM."""
    import pyarrow.parquet as pq

    from shuffled.spark.phase1.native.reader import SplitSizing, plan_native
    from shuffled.spark.spec.model import PartitionPlan

    rows = [json.loads(line) for line in _lines(4000, seed=9)]
    (tmp_path / "in").mkdir()
    for i in range(2):
        part = rows[i::2]
        pq.write_table(pa.table({
            "ts": pa.array([r["ts"] for r in part], pa.int64()),
            "country": [r["country"] for r in part], "user": [r["user"] for r in part],
            "latency": pa.array([r["latency"] for r in part], pa.float64())}),
            tmp_path / "in" / f"p{i}.parquet", row_group_size=500)
    spec = _spec(str(tmp_path / "in"))
    spec["spec"]["ioConfig"]["inputSource"]["filter"] = "*.parquet"
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": "parquet"}
    daemon = start_daemon(tmp_path / "loc")
    try:
        got = {}
        for reader in ("native", "jvm"):
            result = run_ingestion(spec, shuffle_servers=[daemon.url], reader=reader,
                                   output_dir=str(tmp_path / reader))
            assert result.report["phases"]["partialSegmentGeneration"]["reader"] == reader
            _manifest, out = read_output(tmp_path / reader, "sk")
            got[reader] = {(r["__time"], r["country"]): r for r in out.to_pylist()}
    finally:
        daemon.stop()
    assert got["native"].keys() == got["jvm"].keys() and len(got["jvm"]) >= 6
    for key, n in got["native"].items():
        j = got["jvm"][key]
        assert n["count"] == j["count"]
        theta = [ds.compact_theta_sketch.deserialize(x["users_theta"]).get_estimate() for x in (n, j)]
        assert theta[0] == theta[1]
        hn, hj = (ds.hll_sketch.deserialize(x["users_hll"]) for x in (n, j))
        assert hj.get_lower_bound(2) <= hn.get_estimate() <= hj.get_upper_bound(2)
        qn, qj = (ds.quantiles_doubles_sketch.deserialize(x["latency_q"]) for x in (n, j))
        assert (qn.n, qn.get_min_value(), qn.get_max_value()) == \
            (qj.n, qj.get_min_value(), qj.get_max_value())
    pq.write_table(pa.table({"ts": [BASE], "country": ["X"], "user": [7], "latency": [1.0]}),
                   tmp_path / "b.parquet")
    spec["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(tmp_path)
    spec["spec"]["ioConfig"]["inputSource"]["filter"] = "b.parquet"
    why = plan_native(parse_spec(spec), PartitionPlan("hashed", (), num_shards=2),
                      [str(tmp_path / "b.parquet")], SplitSizing(1 << 20, 0, 2, 2))
    assert isinstance(why, str) and "sketch field user of type int64" in why
