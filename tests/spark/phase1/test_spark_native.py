"""The native phase-1 reader (pyarrow on the executors) against the JVM reader and Spark itself.

The native path must be indistinguishable from the JVM path in what it publishes: the same
rows in the same partitions with the same shardSpecs, the same row statistics, and the same
exactly-once behaviour under failed attempts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shuffled.spark import IngestionFailed, run_ingestion
from shuffled.spark.spec.granularity import GRANULARITIES, truncate
from shuffled.spark.phase1.native.reader import Split, SplitSizing, pack, truncate_array
from shuffled.spark.phase1.spark_compat import murmur3
from shuffled.spark.phase1.spark_compat.murmur3 import spark_hash
from tests.helpers.hooks import FailAttempts
from tests.helpers.ingestion import (  # noqa: F401  (fixtures)
    by_interval,
    BASE,
    HOUR,
    base_spec,
    daemons,
    expected_rollup,
    generate,
    read_output,
    spark,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def parquet_input(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], int]:
    """The generator's good records as Parquet (several files and row groups, int64 millis),
    plus rows with a null timestamp (unparseable). Returns (dir, good records, null rows)."""
    base = tmp_path_factory.mktemp("parquet")
    _, good, _ = generate(9000, seed=11)
    good = [g for g in good if not g.get("error")]  # Parquet types its columns: no such rows
    rnd = random.Random(5)
    rows = [dict(g) for g in good] + [{"ms": None, "country": "zz", "device": "web", "clicks": 1,
                                        "revenue": 1.0} for _ in range(7)]
    rnd.shuffle(rows)
    for i in range(3):
        part = rows[i::3]
        table = pa.table({
            "ts": pa.array([r["ms"] for r in part], pa.int64()),
            "country": pa.array([r["country"] for r in part], pa.string()),
            "device": pa.array([r.get("device") for r in part], pa.string()),
            "clicks": pa.array([r["clicks"] for r in part], pa.int64()),
            "revenue": pa.array([r["revenue"] for r in part], pa.float64()),
        })
        pq.write_table(table, base / f"part-{i}.parquet", row_group_size=700)
    return base, good, 7


def _spec(base: Path, partitions: dict[str, Any], **tuning: Any) -> dict[str, Any]:
    spec = base_spec(base, partitions, **tuning)
    spec["spec"]["dataSchema"]["timestampSpec"] = {"column": "ts", "format": "millis"}
    spec["spec"]["ioConfig"]["inputSource"]["filter"] = "*.parquet"
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": "parquet"}
    return spec


def _rounded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with float sums rounded: summation order legitimately differs between readers."""
    return [{k: round(v, 9) if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def _segments(out: Path) -> dict[tuple[str, int], tuple[dict[str, Any], list[dict[str, Any]]]]:
    manifest, _ = read_output(out)
    return {(s["interval"], s["partitionNum"]):
            (s["shardSpec"], _rounded(pq.read_table(out / "events" / s["path"]).to_pylist()))
            for s in manifest["segments"]}


@pytest.mark.parametrize("partitions", [
    {"type": "hashed", "numShards": 3},
    # More partitions than devices: most are empty in every chunk. The native reader's
    # slabs (keyed by partition) publish no segment for them, as the JVM's partials do.
    {"type": "hashed", "numShards": 16, "partitionDimensions": ["device"]},
    {"type": "hashed", "targetRowsPerSegment": 150},
    {"type": "range", "partitionDimensions": ["country", "device"], "targetRowsPerSegment": 300},
], ids=["numShards", "partitionDimensions-empty-partitions", "determined", "range"])
def test_native_and_jvm_readers_publish_identical_segments(
        spark: Any, daemons: list[Any], parquet_input: Any, tmp_path: Path,
        partitions: dict[str, Any]) -> None:
    base, good, nulls = parquet_input
    spec = _spec(base, partitions, maxRowsInMemory=2000,
                 maxBytesInMemory=1 << 16)
    urls = [d.url for d in daemons]
    native = run_ingestion(spec, shuffle_servers=urls, output_dir=str(tmp_path / "n"), reader="native")
    jvm = run_ingestion(spec, shuffle_servers=urls, output_dir=str(tmp_path / "j"), reader="jvm")
    assert native.report["phases"]["partialSegmentGeneration"]["reader"] == "native"
    assert jvm.report["phases"]["partialSegmentGeneration"]["reader"] == "jvm"
    got, want = _segments(tmp_path / "n"), _segments(tmp_path / "j")
    assert len(got) > 2
    if "numShards" not in partitions:
        # Shards decided late by the native reader (docs/slab.md), counted first by the
        # JVM's: the same rows in every interval, cut differently.
        assert native.report["phases"]["determinePartitions"]["method"] == "latePlan"
        assert jvm.report["phases"]["determinePartitions"]["method"] == "scan"
        assert by_interval(got) == by_interval(want)
        return
    assert native.report["phases"]["determinePartitions"]["method"] == "numShards"
    assert native.report["phases"]["partialSegmentGeneration"]["slabs"]  # one data plane
    assert got.keys() == want.keys()
    if partitions["numShards"] > 8:
        assert len({p for _, p in got}) < partitions["numShards"]  # some are empty
    for key in got:  # same rows, same partitions, same shardSpecs
        assert got[key][0] == want[key][0], key
        assert got[key][1] == want[key][1], key
    stats = native.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    jstats = jvm.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    assert stats["unparseable"] == jstats["unparseable"] == nulls
    assert stats["thrownAway"] == jstats["thrownAway"] > 0
    assert stats["processed"] == jstats["processed"]
    events = native.report["ingestionStatsAndErrors"]["unparseableEvents"]
    assert events and "unparseable timestamp [null]" in events[0]["message"]
    assert events[0]["file"].endswith(".parquet") and events[0]["line"] >= 1
    _, table = read_output(tmp_path / "n")
    exp = expected_rollup(good)
    assert table.num_rows == exp.num_rows
    assert sum(table.column("count").to_pylist()) == sum(exp.column("count").to_pylist())


@pytest.mark.parametrize("partitions,method", [
    # Slabs whatever the spec (numShards keys them by partition, the late plan by hash or
    # range): a failed attempt's slabs and statistics count for nothing. (A slab is a
    # flush of every partition: an attempt fails after its first.)
    ({"type": "hashed", "numShards": 2}, "numShards"),
    ({"type": "hashed", "targetRowsPerSegment": 300}, "latePlan"),
    ({"type": "range", "partitionDimensions": ["country"], "targetRowsPerSegment": 300},
     "latePlan"),
], ids=["numShards", "late-hashed", "late-range"])
def test_native_reader_is_exactly_once_under_failed_attempts(
        spark: Any, daemons: list[Any], parquet_input: Any, tmp_path: Path,
        partitions: dict[str, Any], method: str) -> None:
    base, good, _ = parquet_input
    spec = _spec(base, partitions, maxRowsInMemory=500, maxBytesInMemory=1 << 16)
    fault = FailAttempts(partitions=[0, 1], attempts=[0], after_uploads=1)
    result = run_ingestion(spec, shuffle_servers=[d.url for d in daemons],
                           output_dir=str(tmp_path / "o"), reader="native", hooks=fault)
    assert result.report["phases"]["determinePartitions"]["method"] == method
    assert any(s["attemptNumber"] > 0 for s in result.report["subtasks"])
    _, table = read_output(tmp_path / "o")
    exp = expected_rollup(good)
    assert sum(table.column("clicks").to_pylist()) == sum(exp.column("clicks").to_pylist())
    assert sum(table.column("count").to_pylist()) == sum(exp.column("count").to_pylist())
    assert table.num_rows == exp.num_rows


def test_native_reader_refuses_what_it_cannot_read_and_auto_falls_back(
        spark: Any, daemons: list[Any], parquet_input: Any, tmp_path: Path) -> None:
    base, _, _ = parquet_input
    json_spec = base_spec(tmp_path, {"type": "hashed", "numShards": 1})
    json_spec["spec"]["ioConfig"]["inputSource"] = {"type": "inline", "data": '{"ts": 1}'}
    with pytest.raises(IngestionFailed, match="native phase-1 reader cannot read.*inline data"):
        run_ingestion(json_spec, shuffle_servers=[daemons[0].url], output_dir=str(tmp_path / "a"),
                      reader="native")
    transformed = _spec(base, {"type": "hashed", "numShards": 2})
    transformed["spec"]["dataSchema"]["transformSpec"] = {"filter": {"type": "true"}}
    result = run_ingestion(transformed, shuffle_servers=[daemons[0].url],
                           output_dir=str(tmp_path / "b"))
    phase = result.report["phases"]["partialSegmentGeneration"]
    assert phase["reader"] == "jvm" and "transformSpec" in phase["readerReason"]
    with pytest.raises(ValueError, match="reader must be"):
        run_ingestion(transformed, shuffle_servers=[daemons[0].url], output_dir=str(tmp_path / "c"),
                      reader="python")


def test_the_late_plan_builds_no_jvm_rows(spark: Any, daemons: list[Any], parquet_input: Any,
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read natively, the late plan never builds the JVM reader's DataFrame (it cost ~0.3 s
    of driver time a run, unread); a spec the native reader declines still builds it. The
    multi-value dimensions it takes from the spec are those the JVM's rows name: none for
    Parquet input (a list column goes through the JVM; JSON's are checked for every spec
    of test_native_text by ``prepared_both``)."""
    from shuffled.spark.driver import job
    from shuffled.spark.spec.parse import parse_spec
    from shuffled.spark.phase1.columns import native_multi_value
    from shuffled.spark.phase1.jvm.prepare import multi_value_dimensions
    from shuffled.spark.phase1.native.reader import plan_native
    from shuffled.spark.phase1.source import load_input, resolve_files
    from shuffled.spark.spec.model import PartitionPlan

    base, _, _ = parquet_input
    built: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append("rows")
        return load_input(*args, **kwargs)

    monkeypatch.setattr(job, "load_input", counted)
    for n, partitions in enumerate([{"type": "hashed", "numShards": 2},
                                    {"type": "hashed", "targetRowsPerSegment": 300}]):
        result = run_ingestion(_spec(base, partitions), shuffle_servers=[daemons[0].url],
                               output_dir=str(tmp_path / f"late{n}"))
        assert result.report["phases"]["partialSegmentGeneration"]["reader"] == "native"
        assert built == []
    transformed = _spec(base, {"type": "hashed", "numShards": 2})
    transformed["spec"]["dataSchema"]["transformSpec"] = {"filter": {"type": "true"}}
    run_ingestion(transformed, shuffle_servers=[daemons[0].url], output_dir=str(tmp_path / "j"))
    assert built == ["rows"]

    s = parse_spec(_spec(base, {"type": "hashed", "numShards": 2}))
    assert native_multi_value(s) == multi_value_dimensions(
        load_input(spark, s, resolve_files(s)), s) == ()
    listed = tmp_path / "listed"
    listed.mkdir()
    pq.write_table(pa.table({"ts": pa.array([BASE], pa.int64()),
                             "country": pa.array([["a", "b"]], pa.list_(pa.string()))}),
                   listed / "a.parquet")
    s = parse_spec(_spec(listed, {"type": "hashed", "numShards": 2}))
    assert "is a list" in plan_native(s, PartitionPlan("hashed", (), num_shards=2),
                                      resolve_files(s), SplitSizing())
    assert multi_value_dimensions(load_input(spark, s, resolve_files(s)), s) == ("country",)


@pytest.mark.parametrize("steps", [None, (7, 50)], ids=["whole", "in-slices"])
def test_spark_hash_is_sparks_hash(spark: Any, steps: tuple[int, int] | None,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Our hash is Spark's ``hash()`` of the same columns. ``in-slices``: rows hashed 7
    at a time, and dictionaries over 50 values prepared 50 rows at a time (each slice's
    values only), so that every slicing boundary of the real sizes is crossed here."""
    from pyspark.sql import functions as F

    if steps is not None:
        monkeypatch.setattr(murmur3, "STEP", steps[0])
        monkeypatch.setattr(murmur3, "ROWS_AT_A_TIME", steps[1])

    rnd = random.Random(3)
    alphabet = "ab\u20ac\U0001F600\u00e9\x00z9"

    def text() -> str | None:
        # Mostly short values, a few long ones (up to ~1 KiB: many 4-byte blocks).
        size = rnd.randint(0, 23) if rnd.random() < 0.9 else rnd.randint(24, 300)
        return None if rnd.random() < 0.1 else "".join(rnd.choice(alphabet) for _ in range(size))

    rows = [(text(), text(), None if rnd.random() < 0.1 else rnd.randint(-2**63, 2**63 - 1))
            for _ in range(2000)]
    df = spark.createDataFrame(rows, "a string, b string, t bigint")
    want = [r[0] for r in df.select(F.hash("a", "b", "t")).collect()]
    want_t = [r[0] for r in df.select(F.hash("t", "a")).collect()]
    a = pa.array([r[0] for r in rows], pa.string())
    b = pa.array([r[1] for r in rows], pa.string())
    t = pa.array([r[2] for r in rows], pa.int64())
    assert spark_hash([a, b, t]).tolist() == want
    assert spark_hash([t, a.dictionary_encode()]).tolist() == want_t
    # Chunked alike (as a flush's concatenated tables are), each chunk with a dictionary
    # of its own: hashed chunk by chunk, never unified.
    cuts = [0, 1, 700, 1400, len(rows)]

    def chunked(arr: pa.Array, encode: bool = False) -> pa.ChunkedArray:
        parts = [arr.slice(lo, hi - lo) for lo, hi in zip(cuts, cuts[1:])]
        return pa.chunked_array([p.dictionary_encode() for p in parts] if encode else parts)

    assert spark_hash([chunked(a, True), chunked(b), chunked(t)]).tolist() == want
    assert spark_hash([chunked(t), chunked(a, True)]).tolist() == want_t


def test_spark_hash_of_floating_columns_is_sparks_hash(spark: Any) -> None:
    """A double or float dimension under hashed partitioning (Druid's dimension types
    include both, https://druid.apache.org/docs/latest/ingestion/ingestion-spec#dimension-objects):
    the native reader's hash failed with "no Spark-compatible hash for Arrow type double",
    and every such ingestion with it."""
    from pyspark.sql import functions as F

    rnd = random.Random(4)
    special = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.0, -1.5, 1e-310,
               3.4e38, None]
    values = special + [None if rnd.random() < 0.1 else rnd.uniform(-1e6, 1e6)
                        for _ in range(500)]
    rows = [(v, v, str(i)) for i, v in enumerate(values)]
    df = spark.createDataFrame(rows, "d double, f float, s string")
    want = [r[0] for r in df.select(F.hash("d", "s")).collect()]
    want_f = [r[0] for r in df.select(F.hash("f", "s")).collect()]
    s = pa.array([r[2] for r in rows], pa.string())
    assert spark_hash([pa.array(values, pa.float64()), s]).tolist() == want
    assert spark_hash([pa.array(values, pa.float32()), s]).tolist() == want_f


def test_truncate_array_matches_truncate() -> None:
    rnd = np.random.default_rng(9)
    ms = np.concatenate([rnd.integers(-(2 ** 41), 2 ** 42, 3000), [0, -1, BASE, BASE - 1]]).astype(np.int64)
    for g in GRANULARITIES:
        assert truncate_array(ms, g).tolist() == [truncate(int(x), g) for x in ms], g


def test_pack_follows_sparks_split_sizing_and_caps_tasks() -> None:
    groups = [Split(f"f{i // 4}", (i % 4,), 10 << 20) for i in range(12)]  # 3 files x 4 x 10 MiB
    tasks = pack(groups, SplitSizing(max_bytes=32 << 20, open_cost=4 << 20, parallelism=2))
    assert [len(t) for t in tasks] == [3, 3, 3, 3]  # 30 MiB each, never a row group cut
    assert [g for t in tasks for g in t] == groups
    capped = pack(groups, SplitSizing(max_bytes=32 << 20, parallelism=2, max_tasks=2))
    assert len(capped) == 2 and [g for t in capped for g in t] == groups
    assert len(pack(groups, SplitSizing(max_bytes=1 << 30, parallelism=4))) == 4


def test_native_reader_reads_files_that_lack_a_dimension(
        spark: Any, daemons: list[Any], parquet_input: Any, tmp_path: Path) -> None:
    """Files written at different times often differ in columns: one without ``device``
    reads it as null, as the JVM reader does, in the same task as files that have it."""
    base, _, _ = parquet_input
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in sorted(base.glob("*.parquet")):
        table = pq.read_table(f)
        if f.name == "part-1.parquet":
            table = table.drop_columns(["device"])
        pq.write_table(table, mixed / f.name, row_group_size=700)
    spec = _spec(mixed, {"type": "hashed", "numShards": 2}, maxNumConcurrentSubTasks=1)
    urls = [d.url for d in daemons]
    native = run_ingestion(spec, shuffle_servers=urls, output_dir=str(tmp_path / "n"), reader="native")
    jvm = run_ingestion(spec, shuffle_servers=urls, output_dir=str(tmp_path / "j"), reader="jvm")
    assert native.report["phases"]["partialSegmentGeneration"]["reader"] == "native"
    got, want = _segments(tmp_path / "n"), _segments(tmp_path / "j")
    assert got == want and len(got) >= 2
    assert any(r["device"] is None for _, rows in got.values() for r in rows)
