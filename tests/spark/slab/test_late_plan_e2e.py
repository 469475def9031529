"""The spec Druid users write, in one pass (issue 36): hashed and range partitioning with
``targetRowsPerSegment`` or ``maxRowsPerSegment`` and no ``numShards``, through real Spark
(local) and two real daemons. The rows are checked against DuckDB's rollup of the input,
the segments against Druid's docs
(https://druid.apache.org/docs/latest/ingestion/native-batch#partitionsspec: the target
is about that many rows a segment, the max a maximum), and the determine pass must not
run (it raises here)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shuffled.slab.keys import encode_tuple
from shuffled.spark import run_ingestion
from shuffled.spark.phase1.slabs import hash_values
from tests.helpers.ingestion import (  # noqa: F401  (fixtures)
    assert_matches,
    base_spec,
    daemons,
    expected_rollup,
    held_tasks,
    json_input,
    read_output,
    spark,
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    return json_input(tmp_path_factory.mktemp("late"), 12000, seed=11, parts=3)


@pytest.fixture
def no_determine(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the determine pass ran")

    monkeypatch.setattr("shuffled.spark.driver.job.determine", refuse)


def ingest(spark: Any, daemons: list[Any], base: Path, out: Path,
           partitions: dict[str, Any]) -> tuple[dict[str, Any], pa.Table, dict[str, Any]]:
    spec = base_spec(base, partitions, maxNumConcurrentSubTasks=4)
    result = run_ingestion(spec, shuffle_servers=[d.url for d in daemons], output_dir=str(out))
    manifest, table = read_output(out)
    for d in daemons:
        assert held_tasks(d.url) == []  # slabs are deleted with the task
    return manifest, table, result.report


def per_interval(manifest: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in manifest["segments"]:
        out.setdefault(s["interval"], []).append(s)
    return out


def rolled_rows(expected: pa.Table, interval: str) -> int:
    """The rolled-up rows DuckDB finds in ``interval``'s day."""
    from shuffled.protocol import Interval

    iv = Interval.parse_druid(interval)
    t = expected.column("t")
    return int(pc.sum(pc.and_(pc.greater_equal(t, iv.start), pc.less(t, iv.end))).as_py())


def test_hashed_target_in_one_pass(spark: Any, daemons: list[Any], dataset: Any,
                                   tmp_path: Path, no_determine: None) -> None:
    base, good = dataset
    target = 400
    manifest, out, report = ingest(spark, daemons, base, tmp_path / "out",
                                   {"type": "hashed", "targetRowsPerSegment": target})
    expected = expected_rollup(good)
    assert_matches(out, expected)
    assert report["phases"]["determinePartitions"]["method"] == "latePlan"
    assert report["phases"]["partialSegmentGeneration"]["slabs"] > 0
    for interval, segs in per_interval(manifest).items():
        true = rolled_rows(expected, interval)
        assert abs(len(segs) - math.ceil(true / target)) <= 1  # about the target each
        assert sorted(s["partitionNum"] for s in segs) == list(range(len(segs)))
        for s in segs:
            assert s["rows"] <= 2 * target
            spec = s["shardSpec"]
            assert spec["partitionFunction"] == "murmur3_32_range"
            assert spec["partitions"] == len(segs)
            # Every row's hash (Spark's hash() of __time and the dimensions, as today's
            # shardSpec hashes them) lies in the segment's range.
            t = pq.read_table(tmp_path / "out" / "events" / s["path"])
            t = t.set_column(0, "__time", pc.cast(pc.cast(t.column("__time"), pa.timestamp("ms")),
                                                  pa.int64()))
            h = hash_values(t, ("__time", "country", "device"))
            assert spec["start"] is None or int(h.min()) >= spec["start"]
            assert spec["end"] is None or int(h.max()) < spec["end"]


@pytest.mark.parametrize("partitions", [
    {"type": "range", "partitionDimensions": ["country", "device"], "targetRowsPerSegment": 500},
    {"type": "single_dim", "partitionDimension": "country", "maxRowsPerSegment": 700},
], ids=["range-target", "single_dim-max"])
def test_range_in_one_pass(spark: Any, daemons: list[Any], dataset: Any, tmp_path: Path,
                           no_determine: None, partitions: dict[str, Any]) -> None:
    base, good = dataset
    manifest, out, report = ingest(spark, daemons, base, tmp_path / "out", partitions)
    assert_matches(out, expected_rollup(good))
    assert report["phases"]["determinePartitions"]["method"] == "latePlan"
    dims = partitions.get("partitionDimensions") or [partitions["partitionDimension"]]
    cap = partitions.get("maxRowsPerSegment")
    target = partitions.get("targetRowsPerSegment")
    for segs in per_interval(manifest).values():
        assert len(segs) > 1  # secondary partitioning happened
        for s in segs:
            spec = s["shardSpec"]
            t = pq.read_table(tmp_path / "out" / "events" / s["path"])
            keys = {encode_tuple(list(k)) for k in
                    zip(*(t.column(d).to_pylist() for d in dims))}
            if partitions["type"] == "single_dim":
                lo = None if spec["start"] is None else encode_tuple([spec["start"]])
                hi = None if spec["end"] is None else encode_tuple([spec["end"]])
            else:
                lo = None if spec["start"] is None else encode_tuple(spec["start"])
                hi = None if spec["end"] is None else encode_tuple(spec["end"])
            assert all((lo is None or k >= lo) and (hi is None or k < hi) for k in keys)
            # A value is never split (Druid's range partitioning keeps it in one segment):
            # only a segment of one value may be over the cap, or twice the target.
            if s["rows"] > (cap if cap is not None else 2 * target):
                assert len(keys) == 1, (s["rows"], len(keys))


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    return json_input(tmp_path_factory.mktemp("small"), 2000, seed=12, parts=2)


@pytest.mark.parametrize(("partitions", "reader", "method", "why"), [
    ({"type": "hashed", "targetRowsPerSegment": 100}, "jvm", "scan", "JVM reader"),
    ({"type": "hashed", "numShards": 2}, "auto", "numShards", "numShards is given"),
], ids=["jvm-keeps-the-scan", "numShards-reads-nothing"])
def test_the_report_says_how_partitions_were_determined(
        spark: Any, daemons: list[Any], small: Any, tmp_path: Path,
        partitions: dict[str, Any], reader: str, method: str, why: str) -> None:
    """Where the late plan is not taken, the task report says what ran instead and why:
    the JVM reader keeps the determine pass over the input (docs/ingestion.md), numShards
    needs none. The segments still follow Druid's partitionsSpec (about the target a
    segment; numShards segments a chunk at most)."""
    base, good = small
    spec = base_spec(base, partitions, maxNumConcurrentSubTasks=2)
    result = run_ingestion(spec, shuffle_servers=[d.url for d in daemons],
                           output_dir=str(tmp_path / "out"), reader=reader)
    manifest, table = read_output(tmp_path / "out")
    expected = expected_rollup(good)
    assert_matches(table, expected)
    determined = result.report["phases"]["determinePartitions"]
    assert determined["method"] == method
    assert why in determined["methodReason"]
    if method == "numShards":  # nothing estimated: its slabs carry no sketch
        assert determined["estimatedRows"] is None
    for interval, segs in per_interval(manifest).items():
        if method == "scan":
            assert abs(len(segs) - math.ceil(rolled_rows(expected, interval) / 100)) <= 1
        else:
            assert len(segs) <= 2
