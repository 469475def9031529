"""Phase 1's input rows/s on the bench's Druid shape from JSON (bench/druid_json_data.py).

``python -m scripts.druid_json DIR ROWS --run native --run jvm`` (from the repository root) writes ROWS rows as JSON
lines under DIR/in once (the bench's generator: ten years of day chunks, four string
dimensions incl. a 100k-value user id, count + longSum, hashed numShards 2), ingests them
through one local daemon per reader, and prints each run's phase 1 figures from the task
report: input rows (processed + unparseable + thrown away) over the phase's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("rows", type=int)
    parser.add_argument("--run", choices=("native", "jvm"), action="append", default=[])
    args = parser.parse_args()
    from bench import druid_json_data

    data = args.dir / "in"
    if not data.exists():
        druid_json_data.generate(data, args.rows)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shuffled.server.embedded import EmbeddedDaemon
    from shuffled.spark import run_ingestion

    for reader in args.run:
        with EmbeddedDaemon([str(args.dir / f"loc-{reader}")], free_space_reserve=0) as url:
            started = time.monotonic()
            result = run_ingestion(druid_json_data.spec(data), shuffle_servers=[url],
                                   output_dir=str(args.dir / f"out-{reader}"), reader=reader)
            took = time.monotonic() - started
        phase = result.report["phases"]["partialSegmentGeneration"]
        rows = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
        seconds = phase["ingest/task/time"] / 1000
        n = rows["processed"] + rows["unparseable"] + rows["thrownAway"]
        tasks = [(t["rows"], t["ingest/task/time"]) for t in result.report["subtasks"]]
        print(json.dumps({"reader": phase["reader"], "inputRows": n, "phase1Seconds": seconds,
                          "inputRowsPerSecond": round(n / seconds), "tasks(rows,ms)": tasks,
                          "totalSeconds": round(took, 2)}), flush=True)


if __name__ == "__main__":
    main()
