"""Unit tests of the Spark layer's pure parts: spec validation, granularity, rollup, publish."""

from __future__ import annotations

from shuffled.spark.records import Partial, Segment

import random
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shuffled.errors import BadRequest
from shuffled.spark import SpecError, parse_spec
from shuffled.spark.phase1.determine import boundaries
from shuffled.spark.spec.granularity import GRANULARITIES, bucket_end, buckets, truncate
from shuffled.spark.phase2 import durable
from shuffled.spark.phase2.merge import (
    Assignment, assign, balance, batches, merge_partition, merge_partitions, merge_tasks,
)
from shuffled.protocol import Interval
from shuffled.spark.phase2.publish import publish, read_manifest
from shuffled.spark.rows.rollup import Layout, combine, from_ipc, rollup_input, split_by, to_ipc
from tests.helpers.spec_changes import TUTORIAL, with_change


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_tutorial_spec_parses() -> None:
    s = parse_spec(TUTORIAL)
    assert s.data_source == "rollup-tutorial"
    assert s.dimension_names == ("srcIP", "dstIP")
    assert [m.type for m in s.metrics] == ["count", "longSum", "longSum"]
    assert (s.segment_granularity, s.query_granularity, s.rollup) == ("week", "minute", True)
    assert s.partitions.type == "dynamic" and s.partitions.target_rows == 5_000_000
    assert s.input_source.filter == "rollup-data.json"


@pytest.mark.parametrize("path,value,where", [
    ("type", "index", "$.type"),
    ("spec.dataSchema.metricsSpec", [{"type": "hyperUnique", "name": "x", "fieldName": "y"}],
     "$.spec.dataSchema.metricsSpec[0].type"),
    ("spec.dataSchema.metricsSpec", [{"type": "longSum", "name": "x"}],
     "$.spec.dataSchema.metricsSpec[0].fieldName"),
    ("spec.dataSchema.granularitySpec.queryGranularity", "decade",
     "$.spec.dataSchema.granularitySpec.queryGranularity"),
    ("spec.dataSchema.granularitySpec.intervals", ["2018-01-02/2018-01-01"],
     "$.spec.dataSchema.granularitySpec.intervals[0]"),
    ("spec.dataSchema.timestampSpec.format", "yyyy-MM-dd", "$.spec.dataSchema.timestampSpec.format"),
    ("spec.dataSchema.transformSpec", {"filter": {"type": "spatial"}},
     "$.spec.dataSchema.transformSpec.filter.type"),
    ("spec.dataSchema.dimensionsSpec.dimensions", [], "$.spec.dataSchema.dimensionsSpec.dimensions"),
    ("spec.ioConfig.inputSource", {"type": "hdfs", "paths": "hdfs://x"}, "$.spec.ioConfig.inputSource.type"),
    ("spec.ioConfig.inputFormat", {"type": "avro"}, "$.spec.ioConfig.inputFormat.type"),
    ("spec.ioConfig.surprise", 1, "$.spec.ioConfig.surprise"),
    ("spec.tuningConfig.partitionsSpec", {"type": "hashed", "numShards": 0},
     "$.spec.tuningConfig.partitionsSpec.numShards"),
    ("spec.tuningConfig.partitionsSpec", {"type": "hashed", "numShards": 2},
     "$.spec.tuningConfig.forceGuaranteedRollup"),
    ("spec.tuningConfig.partitionsSpec", {"type": "range", "targetRowsPerSegment": 5},
     "$.spec.tuningConfig.partitionsSpec.partitionDimensions"),
    ("spec.tuningConfig.maxParseExceptions", -1, "$.spec.tuningConfig.maxParseExceptions"),
    ("spec.tuningConfig.maxBytesInMemory", -2, "$.spec.tuningConfig.maxBytesInMemory"),
    ("spec.tuningConfig.unknownKnob", True, "$.spec.tuningConfig.unknownKnob"),
])
def test_invalid_or_unsupported_fields_are_named(path: str, value: Any, where: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(with_change(path, value))
    assert info.value.path == where
    assert str(info.value).startswith(where)
    assert isinstance(info.value, BadRequest)


def test_partition_dimension_must_be_a_dimension() -> None:
    spec = with_change("spec.tuningConfig.partitionsSpec",
                       {"type": "hashed", "numShards": 2, "partitionDimensions": ["nope"]})
    spec["spec"]["tuningConfig"]["forceGuaranteedRollup"] = True
    with pytest.raises(SpecError, match=r"partitionDimensions\[0\]"):
        parse_spec(spec)


def test_hashed_range_and_druid_tuning_knobs_are_accepted() -> None:
    spec = with_change("spec.tuningConfig", {
        "type": "index_parallel", "forceGuaranteedRollup": True, "maxNumConcurrentSubTasks": 4,
        "totalNumMergeTasks": 2, "maxRowsInMemory": 50000, "maxBytesInMemory": 10,
        "partitionsSpec": {"type": "single_dim", "partitionDimension": "srcIP",
                           "targetRowsPerSegment": 100}})
    s = parse_spec(spec)
    assert s.partitions.type == "single_dim" and s.partitions.dimensions == ("srcIP",)
    assert (s.max_concurrent_subtasks, s.total_merge_tasks, s.max_rows_in_memory) == (4, 2, 50000)
    assert s.max_bytes_in_memory == 1 << 16  # raised to the smallest useful budget


@pytest.mark.parametrize("value,budget", [(None, 256 << 20), (0, 256 << 20), (-1, 0),
                                          (512 << 20, 512 << 20)])
def test_max_bytes_in_memory_is_druids(value: int | None, budget: int) -> None:
    """Druid's meaning: absent or 0 is the default, -1 lifts the bound (0 here)."""
    tuning = {"type": "index_parallel"}
    if value is not None:
        tuning["maxBytesInMemory"] = value
    assert parse_spec(with_change("spec.tuningConfig", tuning)).max_bytes_in_memory == budget


@pytest.mark.parametrize("gran", [g for g in GRANULARITIES if g != "none"])
def test_granularity_buckets_tile_time(gran: str) -> None:
    t = ms("2019-11-17T13:47:21.123Z")
    start = truncate(t, gran)
    end = bucket_end(start, gran)
    assert start <= t < end
    assert truncate(start, gran) == start and truncate(end, gran) == end
    assert truncate(end - 1, gran) == start


def test_granularity_calendar_and_week_rules() -> None:
    t = ms("2018-01-03T10:00:00Z")  # a Wednesday
    assert truncate(t, "week") == ms("2018-01-01T00:00:00Z")  # Monday
    assert truncate(t, "quarter") == ms("2018-01-01T00:00:00Z")
    assert bucket_end(ms("2018-11-01T00:00:00Z"), "quarter") == ms("2019-02-01T00:00:00Z")
    assert truncate(ms("2018-05-20T07:00:00Z"), "six_hour") == ms("2018-05-20T06:00:00Z")
    assert buckets(ms("2018-01-01T00:00:00Z"), ms("2018-01-03T00:00:00Z"), "week") == [
        ms("2018-01-01T00:00:00Z")]


def _layout() -> Layout:
    return Layout((("d", "string"),), (("n", "count", "sum", "long", None),
                                       ("s", "sum", "sum", "long", "__m1"),
                                       ("lo", "min", "min", "double", "__m2")))


def test_rollup_then_merge_equals_one_rollup() -> None:
    layout = _layout()
    raw = pa.table({"__chunk": [0] * 6, "__bucket": [0, 0, 1, 1, 1, 0], "__time": [1, 1, 1, 2, 1, 1],
                    "d": ["a", "a", None, None, None, "a"], "__m1": [1, 2, 3, None, 5, 6],
                    "__m2": [1.0, 0.5, 3.0, 4.0, 2.0, 0.1]})
    parts = [rollup_input(raw.slice(0, 3), layout, ["__chunk", "__bucket"]),
             rollup_input(raw.slice(3), layout, ["__chunk", "__bucket"])]
    whole = combine(pa.concat_tables(parts), layout, ["__chunk", "__bucket"])
    rows = {(r["__time"], r["d"]): (r["n"], r["s"], r["lo"]) for r in whole.to_pylist()}
    assert rows == {(1, "a"): (3, 9, 0.1), (1, None): (2, 8, 2.0), (2, None): (1, None, 4.0)}
    split = dict(split_by(whole, ["__chunk", "__bucket"]))
    assert sorted(split) == [(0, 0), (0, 1)]
    tables = [from_ipc(to_ipc(t)) for t in split.values()]
    merged = merge_partition(tables, layout)
    assert merged.num_rows == 3
    assert merged.column("__time").to_pylist() == [1, 1, 2]
    assert merged.column("d").to_pylist() == [None, "a", None]  # nulls first


@pytest.mark.parametrize("combine_below", [1 << 30, 0], ids=["one-chunk", "chunked"])
def test_merging_a_batch_equals_merging_each_partition(
        combine_below: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also past COMBINE_MAX_BYTES, where the batch is sorted in its chunks as they came."""
    monkeypatch.setattr("shuffled.spark.phase2.merge.COMBINE_MAX_BYTES", combine_below)
    layout = _layout()
    rng = random.Random(5)
    parts = []
    for n in range(40):  # partitions of 0..60 rows in 1..3 partials, some keys repeated
        partials = []
        for _ in range(1 + n % 3):
            rows = rng.randrange(0, 20)
            raw = pa.table({"__time": [rng.randrange(3) for _ in range(rows)],
                            "d": [rng.choice(["a", "b", None]) for _ in range(rows)],
                            "__m1": [rng.choice([1, 2, None]) for _ in range(rows)],
                            "__m2": [rng.random() for _ in range(rows)]})
            partials.append(rollup_input(raw, layout, []))
        parts.append(partials)
    merged = merge_partitions(parts, layout)
    assert len(merged) == len(parts)
    for got, tables in zip(merged, parts, strict=True):
        assert got.equals(merge_partition(tables, layout))
    plain = Layout(layout.dims, layout.metrics, rollup=False)
    assert [t.num_rows for t in merge_partitions(parts, plain)] == [
        sum(t.num_rows for t in tables) for tables in parts]
    a = [Assignment(i, i + 1, 0, ((("s",), ("x",), rows),)) for i, rows in
         enumerate([10, 10, 400, 10, 10, 10])]
    assert [len(b) for b in batches(a, partitions=3, rows=400)] == [2, 1, 3]
    assert [len(b) for b in batches(a, partitions=2, rows=10**6)] == [2, 2, 2]


def test_merge_tasks_are_sized_from_phase_one_figures() -> None:
    def parts(n: int, rows: int) -> list[Assignment]:
        return [Assignment(i, i + 1, 0, ((("s",), ("x",), rows),)) for i in range(n)]

    assert merge_tasks(parts(7304, 137), 100 << 20, cores=2) == 2  # small: one per core
    assert merge_tasks(parts(48, 200_000), 500 << 20, cores=2) == 5  # 9.6M rows
    assert merge_tasks(parts(48, 200_000), 3 << 30, cores=2) == 8  # bytes ask for 12: 4/core
    assert merge_tasks(parts(3, 10**7), 0, cores=16) == 3  # never more than partitions
    assert merge_tasks(parts(1000, 10), 0, cores=0) == 1


def test_files_are_made_durable_with_or_without_syncfs(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"{i}.parquet"
        path.write_bytes(b"x" * 10)
        paths.append(str(path))
    assert durable.syncfs(str(tmp_path))  # this kernel has it
    durable.sync_files(paths, [str(tmp_path)])
    synced: list[int] = []
    real_fsync = durable.os.fsync
    monkeypatch.setattr(durable, "_libc", None)
    monkeypatch.setattr(durable.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    durable.sync_files(paths, [str(tmp_path)])
    assert len(synced) == len(paths) + 1  # every file and the directory
    with pytest.raises(FileNotFoundError):
        durable.sync_files([str(tmp_path / "gone")], [str(tmp_path)])


def test_range_boundaries_split_evenly_and_skip_repeats() -> None:
    sample = [(f"k{i:03d}",) for i in range(100)]
    b = boundaries(sample, 4)
    assert b == [("k025",), ("k050",), ("k075",)]
    assert boundaries([("x",)] * 50 + [(None,)] * 50, 4) == [("x",)]
    assert boundaries(sample, 1) == []


def test_assign_and_balance_cover_every_partial_once() -> None:
    partials = [Partial(task=i, server=f"http://s{i % 2}", replicas=(f"http://s{i % 2}",),
                        sub=f"p{i}-a{i}-f0", start=0, end=10, partition=i % 3, rows=10 + i,
                        bytes=1) for i in range(9)]
    assignments = assign(partials)
    assert len(assignments) == 3
    assert sum(a.rows for a in assignments) == sum(p.rows for p in partials)
    groups = balance(assignments, 2)
    assert sorted(a.partition for g in groups for a in g) == [0, 1, 2]
    assert isinstance(groups[0][0], Assignment)


def test_publish_replaces_covered_intervals_atomically(tmp_path: Path) -> None:
    ds = tmp_path / "ds"

    def stage(name: str, start: int, end: int, part: int, version: str) -> Segment:
        path = ds / "segments" / version / name  # merge tasks write in place
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        return Segment(start=start, end=end, partition=part, rows=1, rows_in=1, bytes=1,
                       path=str(path), attempt=1)

    shard = lambda s, off: {"type": "numbered", "partitionNum": s.partition + off}  # noqa: E731
    publish(str(ds), "ds", "v1", [stage("a", 0, 10, 0, "v1"), stage("b", 10, 20, 0, "v1")],
            shard, False)
    loser = ds / "segments" / "v2" / "c.a1.parquet"  # an attempt that did not commit
    stage("c.a1.parquet", 0, 10, 0, "v2")
    publish(str(ds), "ds", "v2", [stage("c", 0, 10, 0, "v2")], shard, False)
    assert not loser.exists()
    assert not (ds / "segments" / "v1" / "a").exists()  # replaced by v2: deleted
    segs = read_manifest(str(ds))["segments"]
    assert [(s["interval"][:24], s["version"]) for s in segs] == [
        ("1970-01-01T00:00:00.000Z", "v2"), ("1970-01-01T00:00:00.010Z", "v1")]
    publish(str(ds), "ds", "v3", [stage("d", 0, 10, 0, "v3")], shard, True)
    segs = read_manifest(str(ds))["segments"]
    first = [(s["version"], s["partitionNum"]) for s in segs if s["interval"].startswith("1970-01-01T00:00:00.000Z")]
    assert first == [("v2", 0), ("v2", 1)]
    assert not list(ds.glob("*.tmp*"))
    for s in segs:
        assert (ds / s["path"]).exists()


def test_without_rollup_rows_are_kept_and_count_is_one() -> None:
    layout = Layout((("d", "string"),), (("n", "count", "sum", "long", None),
                                         ("s", "sum", "sum", "long", "__m1")), rollup=False)
    raw = pa.table({"__chunk": [0, 0], "__bucket": [0, 0], "__time": [1, 1], "d": ["a", "a"],
                    "__m1": [2, 3]})
    out = rollup_input(raw, layout, ["__chunk", "__bucket"])
    assert out.column("n").to_pylist() == [1, 1] and out.column("s").to_pylist() == [2, 3]
    assert merge_partition([out.drop_columns(["__chunk", "__bucket"])], layout).num_rows == 2


def test_publish_plan_drops_exactly_the_old_segments_a_new_interval_covers() -> None:
    """The covering test is a bisection over the new intervals (it scanned them all per
    old segment): a wider new interval drops every old one inside it, none straddling it."""
    from shuffled.spark.phase2.publish import plan_moves

    day = 86_400_000
    old = [{"interval": str(Interval(d * day, (d + 1) * day)), "version": "v1",
            "partitionNum": 0, "path": f"p{d}"} for d in range(10)]
    old.append({"interval": str(Interval(8 * day + day // 2, 9 * day + day // 2)),
                "version": "v1", "partitionNum": 0, "path": "straddles"})
    staged = [Segment(start=s, end=e, partition=0, rows=1, rows_in=1, bytes=1,
                      path=f"/r/{s}", attempt=1)
              for s, e in ((2 * day, 5 * day), (5 * day, 6 * day), (8 * day, 9 * day))]
    shard = lambda s, off: {}  # noqa: E731
    _, keep, dropped = plan_moves(old, "ds", "v2", staged, shard, False, "/r")
    assert sorted(s["path"] for s in dropped) == ["p2", "p3", "p4", "p5", "p8"]
    assert len(keep) == len(old) - 5 and {"straddles", "p9", "p0"} <= {s["path"] for s in keep}
    _, keep, dropped = plan_moves(old, "ds", "v2", staged, shard, True, "/r")
    assert not dropped and len(keep) == len(old)


def test_the_manifest_text_is_the_manifest_and_paths_are_relative_to_the_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest's text (a segment a line, json's C encoder) reads back as the value it
    was made from, escapes and empty lists included; the segment paths are what relpath
    gives, under a root written with a trailing slash or a dot, or relative to the cwd."""
    import json
    import os

    from shuffled.spark.phase2.publish import manifest_text, plan_moves

    seg = {"dataSource": "d\u00e9j\u00e0 \"vu\"", "interval": "a/b", "shardSpec": {"x": [1, None]},
           "rows": 1, "path": "segments/v/\u2603\n.parquet"}
    for value in ({"dataSource": "ds", "version": "v", "segments": []},
                  {"dataSource": "ds", "version": "v", "segments": [seg, dict(seg, rows=2)]}):
        text = manifest_text(value)
        assert json.loads(text) == value and text.endswith("}\n")
        # a line a field, a segment a line (and the list's brackets on lines of their own)
        assert text.count("\n") == (6 + len(value["segments"]) if value["segments"] else 5)
    shard = lambda s, off: {}  # noqa: E731
    inside = str(tmp_path / "out" / "segments" / "v" / "x_0.a1.parquet")
    outside = str(tmp_path / "elsewhere" / "y_0.a1.parquet")
    staged = [Segment(start=n, end=n + 1, partition=0, rows=1, rows_in=1, bytes=1, path=p,
                      attempt=1) for n, p in enumerate((inside, outside))]
    monkeypatch.chdir(tmp_path)
    for root in (str(tmp_path / "out"), str(tmp_path / "out") + "/", str(tmp_path / "out/."),
                 "out", "./out/"):
        moves, _, _ = plan_moves([], "ds", "v", staged, shard, False, root)
        assert [d["path"] for _, d in moves] == [os.path.relpath(p, root) for p in
                                                 (inside, outside)], root


def test_frozen_heap_nests_across_threads_and_loses_nothing() -> None:
    """The first block freezes, the last to end unfreezes, whichever thread it is; a cycle
    dropped while frozen is collected once the blocks are over."""
    import gc
    import threading
    import weakref

    from shuffled.spark.driver.gcpause import frozen_heap

    class Node:
        pass

    before = Node()
    before.self = before  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    gone = weakref.ref(before)
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with frozen_heap():
            inside.set()
            release.wait(30)

    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        del before
        gc.collect()
        assert gone() is not None  # frozen: not walked, not freed
        worker = threading.Thread(target=other)
        worker.start()
        assert inside.wait(30)
    assert gc.get_freeze_count() > 0  # the other block still runs
    release.set()
    worker.join(30)
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


class _Verdicts:
    """What the daemon monitor answers once the job failed: nothing more is gone."""

    def verdict(self, servers: list[str]) -> dict[str, str]:
        return {}


def _lost_ctx() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(monitor=_Verdicts(), servers=["http://a", "http://b"],
                           lost={"http://a": "connection refused"}, survivors=["http://b"],
                           phase="phase 2 (merge)")


def test_a_loss_says_whether_anything_was_recomputed() -> None:
    """The paragraph of a failure after a lost daemon said "lost subtasks were recomputed
    from the input, which failed with ..." even when the failure came before any was."""
    from shuffled.spark.driver.failed import IngestionFailed
    from shuffled.spark.driver.pipeline import _explain_loss

    cause = RuntimeError("PythonException: the merge task failed")
    with pytest.raises(IngestionFailed) as none:
        _explain_loss(_lost_ctx(), cause, 0)
    assert "before any lost subtask was recomputed" in none.value.message
    assert "were recomputed" not in none.value.message
    with pytest.raises(IngestionFailed) as some:
        _explain_loss(_lost_ctx(), cause, 3)
    assert "3 lost subtasks recomputed from the input, then the ingestion failed with: " \
           "RuntimeError: PythonException" in some.value.message


def test_ctrl_c_that_py4j_turned_into_its_own_error_is_still_an_interrupt() -> None:
    """Seen in a clean-clone run: Ctrl-C landed while a py4j command was in flight; py4j
    closes that connection in its ``except KeyboardInterrupt`` and, the gateway already
    gone, raised ``Py4JError("Gateway must be connected to send cancel cmd.")`` in its
    place. The ingestion then ended as "a Spark job failed", exit 1, not interrupted."""
    from py4j.protocol import Py4JError

    from shuffled.spark.driver.pipeline import interrupt_of

    def py4j_send() -> None:
        try:
            raise KeyboardInterrupt()
        except KeyboardInterrupt:
            raise Py4JError("Gateway must be connected to send cancel cmd.")

    with pytest.raises(Py4JError) as caught:
        py4j_send()
    got = interrupt_of(caught.value)
    assert isinstance(got, KeyboardInterrupt) and got.__cause__ is caught.value
    plain = KeyboardInterrupt()
    assert interrupt_of(plain) is plain
    assert interrupt_of(RuntimeError("a Spark job failed")) is None
