"""What a sketch metric costs: ``python -m bench.sketches [rows] [repeats] [days]``.

The Druid shape's data (:mod:`bench.druid_data`: ``rows`` rows over ``days`` day chunks,
a user id of up to 100,000 values) rolled up by country, city and device at hour
granularity, with ``count`` plus either an ``HLLSketchBuild`` of the user id (lgK 12,
HLL_4: Druid's defaults) or a second ``count`` in its place, through one embedded daemon on
a local[2] session; ``repeats`` runs of each, alternating, after one warm-up of each.
Twice: with the reader picked as a user's spec would (``auto``: Parquet natively where the
spec allows) and with both on the JVM reader (the same path, so the ratio is the sketch's
own cost). Prints the medians and the ratios (target <= 1.5, issue 16).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench.druid_data import generate, spec


def _spec(data: Path, metric: dict[str, Any]) -> dict[str, Any]:
    s = copy.deepcopy(spec(data))
    schema = s["spec"]["dataSchema"]
    schema["dimensionsSpec"]["dimensions"] = ["country", "city", "device"]
    schema["metricsSpec"] = [{"type": "count", "name": "count"}, metric]
    return s


HLL = {"type": "HLLSketchBuild", "name": "users", "fieldName": "user", "lgK": 12, "stringEncoding": "UTF8",
       "tgtHllType": "HLL_4"}
COUNT = {"type": "count", "name": "users"}


def _one(base: Path, data: Path, name: str, metric: dict[str, Any], reader: str,
         url: str) -> dict[str, Any]:
    from shuffled.spark.driver.pipeline import run_ingestion

    started = time.monotonic()
    result = run_ingestion(_spec(data, metric), shuffle_servers=[url],
                           output_dir=str(base / name), reader=reader)
    seconds = time.monotonic() - started
    phases = {k: v["ingest/task/time"] / 1000 for k, v in result.report["phases"].items()}
    return {"seconds": seconds, "phases": phases, "rowsOut": result.report["rowsOut"],
            "reader": result.report["phases"]["partialSegmentGeneration"].get("reader")}


def main(argv: list[str]) -> int:
    rows = int(argv[0]) if argv else 2_000_000
    repeats = int(argv[1]) if len(argv) > 1 else 3
    days = int(argv[2]) if len(argv) > 2 else 365
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shuffled.server.embedded import EmbeddedDaemon
    from shuffled.spark.driver.sparksession import get_session

    spark, _ = get_session("local[2]")
    base = Path(tempfile.mkdtemp(prefix="bench-sketches-"))
    data = base / "data"
    generate(data, rows, days)
    out: dict[str, Any] = {"rows": rows, "days": days, "repeats": repeats}
    try:
        with EmbeddedDaemon([base / "loc"], free_space_reserve=0) as url:
            for reader in ("auto", "jvm"):
                runs: dict[str, list[dict[str, Any]]] = {"count": [], "hll": []}
                for kind, metric in (("count", COUNT), ("hll", HLL)):
                    _one(base, data, f"warm-{reader}-{kind}", metric, reader, url)
                for i in range(repeats):
                    for kind, metric in (("count", COUNT), ("hll", HLL)):
                        r = _one(base, data, f"{reader}-{kind}-{i}", metric, reader, url)
                        runs[kind].append(r)
                        print(f"{reader} {kind} {i}: {r['seconds']:.1f} s ({r['reader']}) "
                              f"{json.dumps(r['phases'])}", flush=True)
                if runs["count"][0]["rowsOut"] != runs["hll"][0]["rowsOut"]:
                    raise SystemExit("the two specs published different numbers of rows")
                t = {k: median(r["seconds"] for r in v) for k, v in runs.items()}
                out[reader] = {"seconds_median": t, "ratio": t["hll"] / t["count"],
                               "readers": {k: v[0]["reader"] for k, v in runs.items()},
                               "phases_median": {k: {p: median(r["phases"][p] for r in v)
                                                     for p in v[0]["phases"]}
                                                 for k, v in runs.items()},
                               "rowsOut": runs["count"][0]["rowsOut"]}
    finally:
        spark.stop()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
