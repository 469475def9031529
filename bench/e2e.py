"""Comparison 5: end-to-end perfect rollup, ``shuffled.api.ingest`` vs Spark's own shuffle
and vs DuckDB on one node.

The rows are generated once as Parquet (:mod:`bench.e2e_data`); a child process
(:mod:`bench.e2e_worker`) runs the sides alternately on one local[2] SparkSession, after
one untimed warm-up of each, and checks that every side produced the same rows (count,
metric totals and an MD5 over all rows sorted). The task report's phase times say where
shuffled's time goes.
:func:`run_shape` serves comparison 7 (the Druid shape) too.
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

TIMEOUT = 1800.0  # the child is killed past this: a run ends by itself


def _timed(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if not r.get("warmup")]


def _canonical(totals: list[Any]) -> str:
    # [count, metric sums..., md5 of the sorted rows]. DuckDB sums an integer column to a
    # HUGEINT that arrives as a float: the sums compare as floats, the rest exactly.
    return json.dumps([totals[0], *map(float, totals[1:-1]), totals[-1]])


def run_shape(ctx: Ctx, shape: str, data: Path, rows: int, repeats: int,
              sides: tuple[str, ...] = ("shuffled", "spark", "duckdb"),
              variants: dict[str, dict[str, Any]] | None = None,
              check_every_run: bool = False) -> dict[str, Any]:
    """Run the worker on ``data`` and check the sides agree; its JSON plus medians.
    ``variants``: extra sides, shuffled with another partitionsSpec (side name -> spec);
    ``check_every_run``: every run's output (warm-ups too) must equal the last side's
    (the baseline), not only each side's last run."""
    base = data.parent
    out = base / "result.json"
    cmd = [sys.executable, "-m", "bench.e2e_worker", "--shape", shape, "--data", str(data),
           "--workdir", str(base), "--repeats", str(repeats),
           "--warmup", "0" if ctx.quick else "1", "--out", str(out), "--sides", ",".join(sides)]
    for name, partitions in (variants or {}).items():
        cmd += ["--variant", f"{name}={json.dumps(partitions)}"]
    if check_every_run:
        cmd.append("--check-every-run")
    for item in ctx.spark_conf:
        cmd += ["--conf", item]
    log = base.parent / f"{shape}-worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=TIMEOUT,
                              cwd=Path(__file__).resolve().parent.parent, check=False)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{shape} worker exited {proc.returncode}: "
                           + log.read_text(errors="replace")[-1500:])
    got = json.loads(out.read_text())
    totals = got["rowsOut"]
    if len({_canonical(t) for t in totals.values()}) != 1:
        raise RuntimeError(f"the sides disagree on the rolled-up rows (count, metric sums, "
                           f"md5 of the sorted rows): {totals}")
    if check_every_run:
        expected = _canonical(totals[sides[-1]])
        for side, side_runs in got["runs"].items():
            for i, run in enumerate(side_runs):
                if _canonical(run["totals"]) != expected:
                    raise RuntimeError(f"{side}'s run {i} disagrees with {sides[-1]} on the "
                                       f"rolled-up rows: {run['totals']} vs {expected}")
    runs = {k: _timed(v) for k, v in got["runs"].items()}
    seconds = {k: median([r["seconds"] for r in v]) for k, v in runs.items()}
    by_side = {k: {p: median([r["phases"].get(p, 0.0) for r in v]) for p in v[0]["phases"]}
               for k, v in runs.items() if v and "phases" in v[0]}
    first = "shuffled" if "shuffled" in runs else next(iter(by_side))
    ours = runs[first]
    phases = by_side[first]
    peer = runs.get("spark", ours)
    return {"runs": runs, "seconds": seconds, "phases": phases, "phases_by_side": by_side,
            "rows_out": totals[sides[-1]][0],
            "rows_md5": totals[sides[-1]][-1],
            "bytes_shuffled": median([r["bytesShuffled"] for r in ours]),
            "spark_bytes": median([r["sparkShuffleWriteBytes"] for r in peer]),
            "partials": median([r.get("partials") or 0 for r in ours]),
            "slabs": median([r.get("slabs") or 0 for r in ours]), "rows_in": rows,
            "files": {k: int(median([r.get("files", 0) for r in v])) for k, v in runs.items()}}


def run(ctx: Ctx) -> list[Result]:
    """Time, rows/s and bytes shuffled of every side; phase medians in the detail."""
    s = ctx.sizes
    base = ctx.scratch("e2e")
    data = base / "data"
    input_bytes = generate(data, s.e2e_rows)
    r = run_shape(ctx, "e2e", data, s.e2e_rows, s.e2e_repeats)
    t, phases, rows = r["seconds"], r["phases"], s.e2e_rows
    common = {"spark_conf": list(ctx.spark_conf), "rows_in": rows, "rows_out": r["rows_out"],
              "input_parquet_bytes": input_bytes, "phases_median_s": phases,
              "seconds": {k: [x["seconds"] for x in v] for k, v in r["runs"].items()}}
    ctx.notes.append(
        f"5. shuffled ingest of {rows:,} rows: median {t['shuffled']:.1f} s = "
        + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
        + f" (rest: Spark/daemon start-up and cleanup {t['shuffled'] - sum(phases.values()):.1f}"
        f" s); Spark groupBy+Parquet {t['spark']:.1f} s; DuckDB {t['duckdb']:.1f} s; "
        f"{r['rows_out']:,} rows out on every side.")
    label = f"{rows / 1e6:g}M" if rows >= 1_000_000 else f"{rows // 1000}k"
    return [
        compare("e2e_time", f"5. perfect rollup of {label} rows: shuffled ingest vs Spark groupBy",
                t["shuffled"], t["spark"], "s", "<=", 0.4, **common),
        compare("e2e_vs_duckdb", f"5. perfect rollup of {label} rows: shuffled vs DuckDB "
                f"(2 threads)", t["shuffled"], t["duckdb"], "s", "<=", 2.0),
        compare("e2e_rows_per_s", f"5. perfect rollup of {label} rows: throughput",
                rows / t["shuffled"], rows / t["spark"], "rows/s", None, None),
        compare("e2e_bytes_shuffled", f"5. perfect rollup of {label} rows: bytes shuffled",
                r["bytes_shuffled"], r["spark_bytes"], "bytes", "<=", 1.0,
                note="shuffled: bytes sent to the daemon; Spark: shuffle write bytes (lz4)"),
    ]
