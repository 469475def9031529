"""The Druid-shaped bench input (bench/druid_data.py) as newline-delimited JSON, and a run.

``python scripts/druid_json.py DIR ROWS`` writes ROWS rows (ten years of ISO timestamps,
country/city/device/user strings, clicks) in 4 files under DIR/in; with ``--run READER``
it also ingests them (hashed numShards 2, day segments, hour rows, as bench/druid_data.py's
spec) through one local daemon and prints phase 1's input rows/s from the task report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DAY_MS = 86_400_000
T0 = 1_420_070_400_000  # 2015-01-01
DAYS, CITIES, COUNTRIES, DEVICES, USERS, FILES = 3652, 1000, 100, 50, 100_000, 4


def generate(directory: Path, rows: int, seed: int = 11) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    city_country = rng.integers(0, COUNTRIES, CITIES)
    per = -(-rows // FILES)
    for f in range(FILES):
        n = min(per, rows - f * per)
        city = rng.integers(0, CITIES, n)
        user = np.minimum(rng.zipf(1.3, n) - 1, USERS - 1)
        ts = pa.array(np.sort(T0 + rng.integers(0, DAYS * DAY_MS, n)), pa.timestamp("ms"))
        cols = {
            "ts": pc.strftime(ts, "%Y-%m-%dT%H:%M:%SZ"),
            "country": pc.binary_join_element_wise("country-", pc.utf8_lpad(
                pa.array(city_country[city]).cast(pa.string()), 6, "0"), ""),
            "city": pc.binary_join_element_wise("city-", pc.utf8_lpad(
                pa.array(city).cast(pa.string()), 6, "0"), ""),
            "device": pc.binary_join_element_wise("device-", pc.utf8_lpad(
                pa.array(rng.integers(0, DEVICES, n)).cast(pa.string()), 6, "0"), ""),
            "user": pc.binary_join_element_wise("user-", pc.utf8_lpad(
                pa.array(user).cast(pa.string()), 6, "0"), ""),
        }
        clicks = pa.array(rng.integers(0, 100, n)).cast(pa.string())
        line = pc.binary_join_element_wise(
            '{"ts":"', cols["ts"], '","country":"', cols["country"], '","city":"', cols["city"],
            '","device":"', cols["device"], '","user":"', cols["user"], '","clicks":', clicks,
            "}\n", "")
        offsets = np.frombuffer(line.buffers()[1], np.int32)[line.offset:line.offset + n + 1]
        with open(directory / f"part-{f:02d}.json", "wb") as out:  # the lines, back to back
            out.write(memoryview(line.buffers()[2])[offsets[0]:offsets[-1]])


def spec(directory: Path) -> dict:
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "bench_druid",
                "timestampSpec": {"column": "ts", "format": "auto"},
                "dimensionsSpec": {"dimensions": ["country", "city", "device", "user"]},
                "metricsSpec": [{"type": "count", "name": "count"},
                                {"type": "longSum", "name": "clicks", "fieldName": "clicks"}],
                "granularitySpec": {"type": "uniform", "segmentGranularity": "day",
                                    "queryGranularity": "hour", "rollup": True,
                                    "intervals": ["2015-01-01/2025-01-01"]},
            },
            "ioConfig": {"type": "index_parallel",
                         "inputSource": {"type": "local", "baseDir": str(directory),
                                         "filter": "*.json"},
                         "inputFormat": {"type": "json"}},
            "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                             "partitionsSpec": {"type": "hashed", "numShards": 2},
                             "maxNumConcurrentSubTasks": 2, "totalNumMergeTasks": 2},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("rows", type=int)
    parser.add_argument("--run", choices=("native", "jvm"), action="append", default=[])
    args = parser.parse_args()
    if not (args.dir / "in").exists():
        generate(args.dir / "in", args.rows)
    if not args.run:
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shuffled.server.embedded import EmbeddedDaemon
    from shuffled.spark import run_ingestion

    for reader in args.run:
        with EmbeddedDaemon([str(args.dir / f"loc-{reader}")], free_space_reserve=0) as url:
            started = time.monotonic()
            result = run_ingestion(spec(args.dir / "in"), shuffle_servers=[url],
                                   output_dir=str(args.dir / f"out-{reader}"), reader=reader)
            took = time.monotonic() - started
        phase = result.report["phases"]["partialSegmentGeneration"]
        rows = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
        seconds = phase["ingest/task/time"] / 1000
        n = rows["processed"] + rows["unparseable"] + rows["thrownAway"]
        tasks = [(t["rows"], t["ingest/task/time"]) for t in result.report["subtasks"]]
        print(json.dumps({"reader": phase["reader"], "rows": n, "phase1Seconds": seconds,
                          "tasks (rows, ms)": tasks,
                          "inputRowsPerSecond": round(n / seconds) if seconds else None,
                          "totalSeconds": round(took, 2)}), flush=True)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
