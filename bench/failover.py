"""What losing a daemon costs: ``python -m bench.failover [rows] [repeats] [days]``.

The Druid shape (:mod:`bench.druid_data`: ``rows`` rows over ``days`` day chunks, four
string dimensions, hashed numShards 2, read natively from Parquet) ingested through three
``shuffled serve`` processes on loopback by one local[2] Spark session, ``repeats`` times
undisturbed and ``repeats`` times with daemon 0 SIGKILLed by phase-1 task 0 after its
first flush landed there (replication off: that task's partials there are lost, later
flushes of every task fail over), alternating. Each run gets three fresh daemons. Prints
the medians, their ratio (target <= 1.5, docs/failover.md) and what the recovery did
(from the task report), and checks both kinds of run publish the same rows.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import pyarrow.parquet as pq

from bench.daemon import Daemon
from bench.druid_data import generate, spec


def _rows(out: Path) -> tuple[int, int]:
    files = sorted(out.rglob("*.parquet"))
    tables = [pq.read_table(f, columns=["count"]) for f in files]
    return sum(t.num_rows for t in tables), sum(int(t.column(0).to_numpy().sum()) for t in tables)


def _one(base: Path, data: Path, name: str, kill: bool) -> dict[str, Any]:
    from shuffled.spark.driver.pipeline import run_ingestion

    work = base / name
    daemons = [Daemon(work / f"d{i}", fsync=True) for i in range(3)]
    try:
        for d in daemons:
            d.start()
        fault: dict[str, Any] = {}
        if kill:
            assert daemons[0].proc is not None
            fault["kill"] = {"pid": daemons[0].proc.pid, "partition": 0, "after_uploads": 1}
        started = time.monotonic()
        result = run_ingestion(spec(data), shuffle_servers=[d.url for d in daemons],
                               output_dir=str(work / "out"), fault=fault)
        seconds = time.monotonic() - started
        rows = _rows(work / "out")
    finally:
        for d in daemons:
            d.stop()
    report = result.report
    return {"seconds": seconds, "rows": rows, "recovery": report["recovery"],
            "phases": {k: v["ingest/task/time"] / 1000 for k, v in report["phases"].items()},
            "failovers": report["phases"]["partialSegmentGeneration"].get("failovers", 0)}


def main(argv: list[str]) -> int:
    rows = int(argv[0]) if argv else 2_000_000
    repeats = int(argv[1]) if len(argv) > 1 else 3
    days = int(argv[2]) if len(argv) > 2 else 1096  # three years
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shuffled.spark.driver.sparksession import get_session

    spark, _ = get_session("local[2]")
    base = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    data = base / "data"
    generate(data, rows, days)
    runs: dict[str, list[dict[str, Any]]] = {"undisturbed": [], "killed": []}
    try:
        _one(base, data, "warmup", False)  # Python workers and imports, once
        for i in range(repeats):
            for kind in runs:
                runs[kind].append(_one(base, data, f"{kind}-{i}", kind == "killed"))
                print(f"{kind} {i}: {runs[kind][-1]['seconds']:.1f} s "
                      f"{json.dumps(runs[kind][-1]['phases'])}", flush=True)
    finally:
        spark.stop()
    same = {json.dumps(r["rows"]) for v in runs.values() for r in v}
    if len(same) != 1:
        raise SystemExit(f"the runs disagree on the published rows: {same}")
    t = {k: median(r["seconds"] for r in v) for k, v in runs.items()}
    rec = runs["killed"][-1]["recovery"]
    print(json.dumps({"rows": rows, "days": days, "repeats": repeats,
                      "seconds_median": t, "ratio": t["killed"] / t["undisturbed"],
                      "target": "<= 1.5", "rowsOut_countSum": runs["killed"][0]["rows"],
                      "lastRecovery": rec,
                      "failovers": [r["failovers"] for r in runs["killed"]]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
