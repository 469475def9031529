"""Whole ingestions of JSON and CSV: the native and JVM readers publish the same segments.

Same rows in the same partitions with the same shardSpecs (hashed and range), the same
row statistics and unparseable events (file, line, reason, text); a failed attempt's
partials are never published; input the native reader meets and does not read (single
quotes) sends phase 1 through the JVM, and the report says why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from shuffled.spark import run_ingestion
from tests.helpers.hooks import FailAttempts
from tests.helpers.ingestion import (  # noqa: F401  (fixtures)
    base_spec, by_interval, daemons, expected_rollup, generate, read_output, spark,
    write_parts,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def json_input(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], int]:
    base = tmp_path_factory.mktemp("jsonin")
    lines, good, bad = generate(4000, seed=21)
    write_parts(lines, base, parts=3)
    return base, good, bad


def _segments(out: Path, source: str = "events") -> dict[tuple[str, int], tuple[Any, list[Any]]]:
    manifest, _ = read_output(out, source)
    return {(s["interval"], s["partitionNum"]):
            (s["shardSpec"], [{k: round(v, 9) if isinstance(v, float) else v for k, v in r.items()}
                              for r in pq.read_table(out / source / s["path"]).to_pylist()])
            for s in manifest["segments"]}


def _both(spec: dict[str, Any], urls: list[str], tmp: Path, source: str = "events") -> tuple[Any, Any]:
    native = run_ingestion(spec, shuffle_servers=urls, output_dir=str(tmp / "n"), reader="native")
    jvm = run_ingestion(spec, shuffle_servers=urls, output_dir=str(tmp / "j"), reader="jvm")
    got, want = _segments(tmp / "n", source), _segments(tmp / "j", source)
    assert len(got) >= 2
    if "numShards" in spec["spec"]["tuningConfig"]["partitionsSpec"]:
        assert got == want
    else:  # shards decided late by the native reader, counted first by the JVM's
        assert native.report["phases"]["determinePartitions"]["method"] == "latePlan"
        assert by_interval(got) == by_interval(want)
    stats = [r.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"] for r in (native, jvm)]
    for key in ("processed", "processedWithError", "unparseable", "thrownAway"):
        assert stats[0][key] == stats[1][key], key
    events = [sorted(json.dumps(e, sort_keys=True) for e in r.report["ingestionStatsAndErrors"]["unparseableEvents"])
              for r in (native, jvm)]
    assert events[0] == events[1]
    phases = [r.report["phases"]["partialSegmentGeneration"] for r in (native, jvm)]
    assert phases[0]["reader"] == "native" and phases[1]["reader"] == "jvm"
    return native, jvm


def test_json_native_and_jvm_publish_identical_segments(
        spark: Any, daemons: list[Any], json_input: Any, tmp_path: Path) -> None:
    """Range partitions over two dimensions (hashed ones: test_objstore's s3 JSON, read
    natively, against local JSON read by the JVM)."""
    partitions = {"type": "range", "partitionDimensions": ["country", "device"],
                  "targetRowsPerSegment": 250}
    base, good, bad = json_input
    spec = base_spec(base, partitions, maxRowsInMemory=1500, maxSavedParseExceptions=1000)
    native, _ = _both(spec, [d.url for d in daemons], tmp_path)
    assert native.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]["unparseable"] == bad
    _, table = read_output(tmp_path / "n")
    assert sum(table.column("count").to_pylist()) == sum(expected_rollup(good).column("count").to_pylist())
    assert any(s["shardSpec"]["type"] == "range" and s["shardSpec"].get("start")
               for s in read_output(tmp_path / "n")[0]["segments"])


def test_a_double_dimension_hashes_as_the_jvm_reader_hashes_it(
        spark: Any, daemons: list[Any], json_input: Any, tmp_path: Path) -> None:
    """Druid's dimensions may be doubles and hashed partitioning may name them
    (https://druid.apache.org/docs/latest/ingestion/partitioning): the native JSON
    reader's slab keys failed on a double column ("no Spark-compatible hash for Arrow
    type double"), and so did the whole ingestion. Each row now lands in the partition the
    JVM reader's ``pmod(hash(..), numShards)`` gives it."""
    base, _, _ = json_input
    spec = base_spec(base, {"type": "hashed", "numShards": 3,
                            "partitionDimensions": ["device", "revenue"]},
                     maxSavedParseExceptions=1000)
    schema = spec["spec"]["dataSchema"]
    schema["dimensionsSpec"]["dimensions"] = ["country", "device",
                                              {"type": "double", "name": "revenue"}]
    schema["metricsSpec"] = [{"type": "count", "name": "count"},
                             {"type": "longSum", "name": "clicks", "fieldName": "clicks"}]
    native, _ = _both(spec, [d.url for d in daemons], tmp_path)
    assert native.report["phases"]["partialSegmentGeneration"]["slabs"]
    assert len({s["shardSpec"]["partitionNum"]
                for s in read_output(tmp_path / "n")[0]["segments"]}) == 3


def test_csv_with_transforms_and_range_partitions(spark: Any, daemons: list[Any], json_input: Any,
                                                  tmp_path: Path) -> None:
    base, good, _ = json_input
    (tmp_path / "in").mkdir()
    rows = ["ts,country,device,clicks,revenue"]
    rows += [f"{g['ts']},{g['country']},{g.get('device') or ''},{g['clicks']},{g['revenue']}" for g in good]
    rows.insert(500, "2018-03-01T00:00:00Z,short")
    (tmp_path / "in" / "a.csv").write_text("\n".join(rows[:3000]) + "\n")
    (tmp_path / "in" / "b.csv").write_text("\n".join(rows[:1] + rows[3000:]) + "\n")
    spec = base_spec(tmp_path / "in", {"type": "range", "partitionDimensions": ["country"],
                                       "targetRowsPerSegment": 250}, maxSavedParseExceptions=100)
    io = spec["spec"]["ioConfig"]
    io["inputSource"]["filter"] = "*.csv"
    io["inputFormat"] = {"type": "csv", "findColumnsFromHeader": True}
    spec["spec"]["dataSchema"]["transformSpec"] = {
        "transforms": [{"type": "expression", "name": "device", "expression": "upper(nvl(device, 'none'))"},
                       {"type": "expression", "name": "clicks", "expression": "clicks * 2"}],
        "filter": {"type": "bound", "dimension": "revenue", "lower": "1", "ordering": "numeric"}}
    native, _ = _both(spec, [d.url for d in daemons], tmp_path)
    stats = native.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    assert stats["unparseable"] == 1 and stats["thrownAway"] > 0


def test_native_text_reader_is_exactly_once_under_failed_attempts(
        spark: Any, daemons: list[Any], json_input: Any, tmp_path: Path) -> None:
    base, good, _ = json_input
    spec = base_spec(base, {"type": "hashed", "numShards": 2}, maxRowsInMemory=1000,
                     maxBytesInMemory=1 << 16)
    # numShards goes as slabs: a slab is a flush of every partition, so an attempt fails
    # after its first.
    fault = FailAttempts(partitions=[0, 1], attempts=[0], after_uploads=1)
    result = run_ingestion(spec, shuffle_servers=[d.url for d in daemons],
                           output_dir=str(tmp_path / "o"), reader="native", hooks=fault)
    assert any(s["attemptNumber"] > 0 for s in result.report["subtasks"])
    _, table = read_output(tmp_path / "o")
    exp = expected_rollup(good)
    assert table.num_rows == exp.num_rows
    assert sum(c or 0 for c in table.column("clicks").to_pylist()) == sum(
        c or 0 for c in exp.column("clicks").to_pylist())


def test_input_the_native_reader_does_not_read_goes_through_the_jvm(
        spark: Any, daemons: list[Any], tmp_path: Path) -> None:
    """A line Spark reads and pyarrow does not (single quotes) is only met in a task: the
    native attempt's partials stay uncommitted and phase 1 runs again through the JVM."""
    lines, good, _ = generate(1500, seed=4)
    lines.insert(700, "{'ts': '2018-03-01T10:00:00Z', 'country': 'quoted', 'clicks': 1}")
    write_parts(lines, tmp_path / "in", parts=2)
    spec = base_spec(tmp_path / "in", {"type": "hashed", "numShards": 2})
    result = run_ingestion(spec, shuffle_servers=[d.url for d in daemons],
                           output_dir=str(tmp_path / "o"))
    phase = result.report["phases"]["partialSegmentGeneration"]
    assert phase["reader"] == "jvm"
    assert "met what it does not read" in phase["readerReason"] and "part-0.json:701" in phase["readerReason"]
    _, table = read_output(tmp_path / "o")
    assert "quoted" in table.column("country").to_pylist()
    assert sum(table.column("count").to_pylist()) == sum(expected_rollup(good).column("count").to_pylist()) + 1
