"""The late plan at 10,000 time chunks with the smallest driver heap Spark starts with
(issue 36: the driver holds nothing proportional to the input): `shuffled ingest` of
10,000 day chunks, the shards planned on the executors, the driver given the task lines
and the plan only. Druid's docs
(https://druid.apache.org/docs/latest/ingestion/native-batch#partitionsspec): segments of
about ``targetRowsPerSegment`` rows; checked as none over twice it, every row once."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

DAY = 86_400_000
BASE = 946_684_800_000  # 2000-01-01


def _flights(directory: Path, days: int, per_day: int) -> pa.Table:
    rng = np.random.default_rng(1)
    n = days * per_day
    day = np.repeat(np.arange(days, dtype=np.int64), per_day)
    table = pa.table({
        "ts": BASE + day * DAY + rng.integers(0, 24, n) * 3_600_000,
        "carrier": np.array([f"C{i:02d}" for i in range(20)])[rng.integers(0, 20, n)],
        "origin": np.array([f"O{i:04d}" for i in range(3000)])[rng.integers(0, 3000, n)],
        "dest": np.tile(np.array([f"D{i:05d}" for i in range(per_day)]), days),
        "delay": rng.integers(0, 100, n),
    })
    directory.mkdir(parents=True, exist_ok=True)
    step = math.ceil(n / 4)
    for p in range(4):
        pq.write_table(table.slice(p * step, step), directory / f"part-{p}.parquet")
    return table


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [
    {"type": "hashed", "targetRowsPerSegment": 20},
    {"type": "range", "targetRowsPerSegment": 20, "partitionDimensions": ["carrier", "origin"]},
], ids=["hashed", "range"])
def test_ten_thousand_chunks_on_a_small_driver(tmp_path: Path, partitions: dict) -> None:
    root = Path(__file__).resolve().parents[3]
    days, per_day, target = 10_000, 30, 20
    table = _flights(tmp_path / "in", days, per_day)
    keys = table.group_by(["ts", "carrier", "origin", "dest"]).aggregate([]).num_rows
    spec = {"type": "index_parallel", "spec": {
        "dataSchema": {
            "dataSource": "flights",
            "timestampSpec": {"column": "ts", "format": "millis"},
            "dimensionsSpec": {"dimensions": ["carrier", "origin", "dest"]},
            "metricsSpec": [{"type": "count", "name": "count"},
                            {"type": "longSum", "name": "delay", "fieldName": "delay"}],
            "granularitySpec": {"segmentGranularity": "day", "queryGranularity": "hour",
                                "rollup": True}},
        "ioConfig": {"type": "index_parallel",
                     "inputSource": {"type": "local", "baseDir": str(tmp_path / "in"),
                                     "filter": "*.parquet"},
                     "inputFormat": {"type": "parquet"}},
        "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                         "partitionsSpec": partitions}}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-m", "shuffled", "ingest", str(tmp_path / "spec.json"),
                           "--output", str(tmp_path / "out"), "--conf", "spark.driver.memory=512m"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((tmp_path / "out/flights/manifest.json").read_text())
    rows = [s["rows"] for s in manifest["segments"]]
    assert len({s["interval"] for s in manifest["segments"]}) == days
    assert sum(rows) == keys and max(rows) <= 2 * target, max(rows)
    report = json.loads((tmp_path / "out/flights/task-report.json").read_text())
    determined = report["phases"]["determinePartitions"]
    assert determined["method"] == "latePlan"
    assert determined["rowsToDriver"] == len(rows)  # the plan: one entry per shard
