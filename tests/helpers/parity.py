"""Druid-parity checks (tests/spark/parity): one spec run through both phase-1 readers, the
published rows read back through the manifest, and the row statistics of each run.

The expected values of those tests are written from Druid's documented behaviour (each
test cites the page), never from this pipeline's output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

READERS = ("native", "jvm")


def spec_for(base: Path, input_format: dict[str, Any], *, dimensions: list[Any],
             metrics: list[dict[str, Any]], filter_: str = "*", **tuning: Any) -> dict[str, Any]:
    """An index_parallel spec over the files of ``base``: timestamp ``ts`` (iso), day
    segments and day query granularity, rollup, dynamic partitioning."""
    return {"type": "index_parallel", "spec": {
        "dataSchema": {
            "dataSource": "parity",
            "timestampSpec": {"column": "ts", "format": "iso"},
            "dimensionsSpec": {"dimensions": dimensions},
            "metricsSpec": metrics,
            "granularitySpec": {"segmentGranularity": "day", "queryGranularity": "day",
                                "rollup": True}},
        "ioConfig": {"type": "index_parallel",
                     "inputSource": {"type": "local", "baseDir": str(base), "filter": filter_},
                     "inputFormat": input_format},
        "tuningConfig": {"type": "index_parallel", **tuning}}}


def published_rows(out: Path, data_source: str = "parity") -> list[dict[str, Any]]:
    """Every row of the segments the manifest lists, sorted, ``__time`` as ISO text."""
    ds = out / data_source
    manifest = json.loads((ds / "manifest.json").read_text())
    rows: list[dict[str, Any]] = []
    for seg in manifest["segments"]:
        t = pq.read_table(ds / seg["path"])
        seconds = pc.cast(t.column("__time"), pa.timestamp("s", tz="UTC"))
        t = t.set_column(0, "__time", pc.strftime(seconds, "%Y-%m-%dT%H:%M:%SZ"))
        rows += t.to_pylist()
    return ordered(rows)


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in one order (by their values' text, column by column)."""
    return sorted(rows, key=lambda r: [str(v) for v in r.values()])


def run(spec: dict[str, Any], urls: list[str], out: Path, reader: str) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]], dict[str, Any]]:
    """(rows, rowStats.buildSegments, unparseableEvents, the report) of one ingestion."""
    from shuffled.spark import run_ingestion

    result = run_ingestion(spec, shuffle_servers=urls, output_dir=str(out), reader=reader)
    report = result.report
    stats = report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    events = report["ingestionStatsAndErrors"]["unparseableEvents"]
    return published_rows(out), stats, events, report
