"""Phase 2 in bounded memory, end to end: one partition three times the merge task's
budget (maxBytesInMemory), of rows rollup cannot fold, publishes exactly the input's rows,
sorted, while the merge task's peak RSS (from /proc, reset when the task starts) grows by
at most the budget plus a documented constant. One whose rows fold only in phase 2 spills
only what they fold to.

Each task here first hands back what its worker's allocators kept from earlier tasks (the
tests' :class:`ReleaseAtTaskStart` hook; production keeps those pages for the next task),
so the growth measured is the merge's own use, not what it reused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shuffled.spark import run_ingestion
from tests.helpers.hooks import ReleaseAtTaskStart
from tests.helpers.ingestion import read_output, spark, start_daemon  # noqa: F401

BUDGET = 16 << 20
# What a merge may add to its worker beyond the budget (docs/memory.md): one fetched partial
# (bounded by phase 1's flush), the streaming working set, Parquet's writer and what the
# allocators keep, and code first run in this worker. Measured here: 73-92 MiB for budgets of
# 4-64 MiB and partitions of 57-690 MB merged alone, 119 MiB in this test; the same
# partition merged in one piece (maxBytesInMemory -1) grows it by 419 MiB, and takes longer.
SLACK = 128 << 20
DAY = 1_520_985_600_000  # 2018-03-14


def _input(base: Path, rows: int) -> pa.Table:
    rng = np.random.default_rng(5)
    ts = DAY + np.sort(rng.integers(0, 86_400_000, rows))
    table = pa.table({
        "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
        "id": pa.array([f"user-{i:09d}" for i in rng.permutation(rows)], pa.string()),
        "site": pa.array(rng.integers(0, 50, rows).astype(str)),
        "clicks": pa.array(rng.integers(0, 100, rows), pa.int64()),
    })
    base.mkdir()
    for i, part in enumerate(range(0, rows, rows // 4)):
        pq.write_table(table.slice(part, rows // 4), base / f"part-{i}.parquet")
    return table


@pytest.mark.parametrize("partitions", [
    {"type": "hashed", "numShards": 1},
    {"type": "hashed", "targetRowsPerSegment": 5_000_000},  # the late plan: one shard too
], ids=["numShards", "late-hashed"])
def test_partition_three_times_the_budget(spark: Any, tmp_path: Path,
                                          partitions: dict[str, Any]) -> None:
    rows = 1_200_000
    source = _input(tmp_path / "in", rows)
    report = _ingest(tmp_path, _spec("big", tmp_path / "in", ["id", "site"], "none",
                                     partitions))
    merge = _find(report, "partialSegmentMerge")
    assert merge["partitionsSpilled"] == 1 and merge["spillBytes"] > 3 * BUDGET
    # numShards goes as slabs: the one shard is read in narrower ranges of its hash, each
    # within the budget (slabmerge._paged), not fetched whole before its bounded merge.
    assert merge["shardsReadInPages"] == 1
    # the partition really is three times the budget (uncompressed: as it is merged)
    shipped = _find(report, "partialSegmentGeneration")["bytesBeforeCompression"]
    assert shipped > 3 * BUDGET
    assert 0 < merge["peakTaskRssGrowthBytes"] <= BUDGET + SLACK, merge

    manifest, out = read_output(tmp_path / "out", "big")
    assert [s["rows"] for s in manifest["segments"]] == [rows]
    seg = pq.read_table(tmp_path / "out" / "big" / manifest["segments"][0]["path"])
    ms = pc.cast(pc.cast(seg.column("__time"), pa.timestamp("ms")), pa.int64()).to_numpy()
    keys = list(zip(ms.tolist(), seg.column("id").to_pylist()))
    assert keys == sorted(keys)  # written in the segment's order as it streamed
    want = sorted(zip(pc.cast(pc.cast(source.column("ts"), pa.timestamp("ms")), pa.int64())
                      .to_pylist(), source.column("id").to_pylist(),
                      source.column("clicks").to_pylist()))
    got = sorted(zip(ms.tolist(), seg.column("id").to_pylist(), seg.column("clicks").to_pylist()))
    assert got == want
    assert set(seg.column("count").to_pylist()) == {1}


def test_paged_shard_spills_only_its_rolled_up_rows(spark: Any, tmp_path: Path) -> None:
    """A shard read in pages (hash ranges of it, slabmerge._paged) whose rows fold only
    across phase 1's flushes: no key is in two pages, so each page is rolled up as it comes
    and the bounded merge spills the 100,000 rows they fold to, not the ~760,000 fetched
    (comparison 5 spilled every row fetched, twice: docs/benchmarks.md)."""
    rows, ids = 1_200_000, 100_000
    rng = np.random.default_rng(9)
    base = tmp_path / "in"
    base.mkdir()
    source = pa.table({
        "ts": pa.array(DAY + rng.integers(0, 86_400_000, rows), pa.timestamp("ms", tz="UTC")),
        "id": pa.array([f"user-{i:09d}" for i in range(ids)]).take(
            pa.array(rng.integers(0, ids, rows))),
        "clicks": pa.array(rng.integers(0, 100, rows), pa.int64()),
    })
    for i in range(4):
        pq.write_table(source.slice(i * rows // 4, rows // 4), base / f"part-{i}.parquet")
    report = _ingest(tmp_path, _spec("folds", base, ["id"], "day",
                                     {"type": "hashed", "numShards": 1}))
    merge = _find(report, "partialSegmentMerge")
    generation = _find(report, "partialSegmentGeneration")
    assert merge["shardsReadInPages"] == 1
    assert generation["rowsShipped"] > 5 * ids  # phase 1 folded little: phase 2 must
    # every row fetched is spilled at least twice by a merge of the rows as fetched
    assert merge["spillBytes"] < generation["bytesBeforeCompression"] / 2, (merge, generation)

    manifest, _ = read_output(tmp_path / "out", "folds")
    assert [s["rows"] for s in manifest["segments"]] == [ids]
    seg = pq.read_table(tmp_path / "out" / "folds" / manifest["segments"][0]["path"])
    assert seg.column("id").to_pylist() == sorted(seg.column("id").to_pylist())
    want = source.group_by("id").aggregate([("clicks", "sum"), ("clicks", "count")])
    assert (dict(zip(seg.column("id").to_pylist(), zip(seg.column("clicks").to_pylist(),
                                                      seg.column("count").to_pylist())))
            == dict(zip(want.column("id").to_pylist(),
                        zip(want.column("clicks_sum").to_pylist(),
                            want.column("clicks_count").to_pylist()))))


def _spec(source: str, base: Path, dimensions: list[str], query_granularity: str,
          partitions: dict[str, Any]) -> dict[str, Any]:
    """One day of ``base``'s Parquet rolled up by ``dimensions``: count and longSum of
    clicks, one merge task, phase 1 flushing every 100,000 rows, the budget BUDGET."""
    return {"type": "index_parallel", "spec": {
        "dataSchema": {
            "dataSource": source, "timestampSpec": {"column": "ts", "format": "auto"},
            "dimensionsSpec": {"dimensions": dimensions},
            "metricsSpec": [{"type": "count", "name": "count"},
                            {"type": "longSum", "name": "clicks", "fieldName": "clicks"}],
            "granularitySpec": {"segmentGranularity": "day",
                                "queryGranularity": query_granularity, "rollup": True}},
        "ioConfig": {"type": "index_parallel",
                     "inputSource": {"type": "local", "baseDir": str(base),
                                     "filter": "*.parquet"},
                     "inputFormat": {"type": "parquet"}},
        "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                         "partitionsSpec": partitions,
                         "maxRowsInMemory": 100_000, "maxBytesInMemory": BUDGET,
                         "totalNumMergeTasks": 1}}}


def _ingest(tmp_path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` run against one daemon, output under ``tmp_path / "out"``, each task
    starting from an emptied pool: its report. Asserts the hook ran for every task."""
    daemon = start_daemon(tmp_path / "loc")
    record = tmp_path / "task-starts"
    try:
        result = run_ingestion(spec, shuffle_servers=[daemon.url],
                               output_dir=str(tmp_path / "out"),
                               hooks=ReleaseAtTaskStart(str(record)))
    finally:
        daemon.stop()
    report = json.loads(Path(result.report_path).read_text())
    tasks = len(_find(report, "subtasks", list)) + _find(report, "partialSegmentMerge")["tasks"]
    assert len(record.read_text().splitlines()) >= tasks, report
    return report


def _find(report: dict[str, Any], key: str, kind: type = dict) -> Any:
    """The value of type ``kind`` under ``key`` in the task report (a phase's figures by
    default), wherever the report nests it."""
    stack: list[Any] = [report]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get(key), kind):
                return node[key]
            stack.extend(node.values())
    raise KeyError(key)
