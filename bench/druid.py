"""Comparison 7: the Druid shape, ten years of ``day`` segments (thousands of small partials).

The same three sides as comparison 5 (shuffled ingest, Spark groupBy + write, DuckDB with
2 threads) on :mod:`bench.druid_data`, checked to produce the same rows, plus phase 1's
input rows per second (the figure issue 11 targets: >= 1M rows/s on this machine).
"""

from __future__ import annotations

from bench.context import Ctx
from bench.druid_data import DAYS, generate
from bench.e2e import run_shape
from bench.stats import Result, absolute, compare


def run(ctx: Ctx) -> list[Result]:
    s = ctx.sizes
    base = ctx.scratch("druid")
    data = base / "data"
    input_bytes = generate(data, s.druid_rows)
    r = run_shape(ctx, "druid", data, s.druid_rows, s.e2e_repeats)
    t, phases, rows = r["seconds"], r["phases"], s.druid_rows
    phase1 = phases.get("partialSegmentGeneration", 0.0) or 1e-9
    common = {"rows_in": rows, "rows_out": r["rows_out"], "days": DAYS,
              "partials": r["partials"], "input_parquet_bytes": input_bytes,
              "phases_median_s": phases,
              "seconds": {k: [x["seconds"] for x in v] for k, v in r["runs"].items()}}
    ctx.notes.append(
        f"7. Druid shape, {rows:,} rows over {DAYS:,} days ({r['partials']:,} partials): "
        f"shuffled {t['shuffled']:.1f} s = " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
        + f"; Spark {t['spark']:.1f} s; DuckDB {t['duckdb']:.1f} s; "
        f"{r['rows_out']:,} rows out on every side.")
    label = f"{rows / 1e6:g}M rows, {DAYS:,} day chunks"
    return [
        compare("druid_vs_duckdb", f"7. Druid shape ({label}): shuffled vs DuckDB (2 threads)",
                t["shuffled"], t["duckdb"], "s", "<=", 3.0, **common),
        compare("druid_vs_spark", f"7. Druid shape ({label}): shuffled vs Spark groupBy",
                t["shuffled"], t["spark"], "s", "<=", 0.3),
        absolute("druid_phase1", f"7. Druid shape ({label}): phase 1 input rows/s",
                 rows / phase1, "rows/s", ">=", 1_000_000),
    ]
