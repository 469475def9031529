"""Comparison 5: end-to-end perfect rollup, ``shuffled.api.ingest`` vs Spark's own shuffle.

The rows are generated once as Parquet (:mod:`bench.e2e_data`); a child process
(:mod:`bench.e2e_worker`) runs both sides alternately on one local[2] SparkSession, after
one untimed warm-up of each, and checks that both produced the same number of rolled-up
rows. The task report's phase times say where shuffled's time goes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.context import Ctx
from bench.e2e_data import generate
from bench.stats import Result, compare, median

TIMEOUT = 900.0  # the child is killed past this: a run ends by itself


def _timed(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if not r.get("warmup")]


def run(ctx: Ctx) -> list[Result]:
    """Time, rows/s and bytes shuffled of both sides; phase medians in the detail."""
    s = ctx.sizes
    base = ctx.scratch("e2e")
    data = base / "data"
    input_bytes = generate(data, s.e2e_rows)
    out = base / "result.json"
    cmd = [sys.executable, "-m", "bench.e2e_worker", "--data", str(data), "--workdir",
           str(base), "--repeats", str(s.e2e_repeats), "--warmup", "0" if ctx.quick else "1",
           "--out", str(out)]
    for item in ctx.spark_conf:
        cmd += ["--conf", item]
    log = base.parent / "e2e-worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=TIMEOUT,
                              cwd=Path(__file__).resolve().parent.parent, check=False)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"e2e worker exited {proc.returncode}: "
                           + log.read_text(errors="replace")[-1500:])
    got = json.loads(out.read_text())
    ours, theirs = _timed(got["runs"]["shuffled"]), _timed(got["runs"]["spark"])
    rows_out = got["rowsOut"]
    if rows_out["spark"] != rows_out["shuffled"]:
        raise RuntimeError(f"the two sides disagree on the rolled-up rows: {rows_out}")
    t_ours = median([r["seconds"] for r in ours])
    t_base = median([r["seconds"] for r in theirs])
    phases = {k: median([r["phases"].get(k, 0.0) for r in ours]) for k in ours[0]["phases"]}
    shuffled_bytes = median([r["bytesShuffled"] for r in ours])
    spark_bytes = median([r["sparkShuffleWriteBytes"] for r in theirs])
    rows = s.e2e_rows
    common = {"spark_conf": list(ctx.spark_conf), "rows_in": rows, "rows_out": rows_out["spark"], "input_parquet_bytes": input_bytes,
              "seconds": {"shuffled": [r["seconds"] for r in ours],
                          "spark": [r["seconds"] for r in theirs]},
              "phases_median_s": phases, "runs": got["runs"]}
    ctx.notes.append(
        f"5. shuffled ingest of {rows:,} rows: median {t_ours:.1f} s = "
        + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
        + f" (rest: Spark/daemon start-up and cleanup {t_ours - sum(phases.values()):.1f} s); "
        f"Spark groupBy+Parquet {t_base:.1f} s; {rows_out['spark']:,} rows out on both sides.")
    label = f"{rows / 1e6:g}M" if rows >= 1_000_000 else f"{rows // 1000}k"
    return [
        compare("e2e_time", f"5. perfect rollup of {label} rows: shuffled ingest vs Spark groupBy",
                t_ours, t_base, "s", "<=", 1.5, **common),
        compare("e2e_rows_per_s", f"5. perfect rollup of {label} rows: throughput",
                rows / t_ours, rows / t_base, "rows/s", None, None),
        compare("e2e_bytes_shuffled", f"5. perfect rollup of {label} rows: bytes shuffled",
                shuffled_bytes, spark_bytes, "bytes", None, None,
                note="shuffled: bytes PUT to the daemon; Spark: shuffle write bytes (lz4)"),
    ]
