"""Comparison 7: the Druid shape, ten years of ``day`` segments (thousands of small partials).

The same three sides as comparison 5 on :mod:`bench.druid_data` (a few million rows over
3,652 day time chunks, hour query granularity, four string dimensions of which a user id
of 100,000 values, count + longSum, hashed partitioning numShards 2): shuffled's
ingestion (``shuffled.api.ingest``, embedded daemon), Spark's own groupBy + Parquet write
on the same local[2] session, and DuckDB's GROUP BY + COPY TO Parquet with 2 threads. Every
side's output is checked to hold the same rows (count, metric totals, MD5 of the sorted
rows). Phase 1's input rows per second come from the task report
(``phases.partialSegmentGeneration``), as does the number of partials.
"""

from __future__ import annotations

from bench.context import Ctx
from bench.druid_data import generate
from bench.e2e import run_shape
from bench.stats import Result, absolute, compare, info


def _rows(n: int) -> str:
    """``3M`` / ``20k`` for titles."""
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1000:g}k"


def run(ctx: Ctx) -> list[Result]:
    """Wall-time ratios to DuckDB and Spark, phase 1 rows/s, partials (info)."""
    s = ctx.sizes
    base = ctx.scratch("druid")
    data = base / "data"
    days = s.druid_days
    input_bytes = generate(data, s.druid_rows, days)
    r = run_shape(ctx, "druid", data, s.druid_rows, s.e2e_repeats)
    t, phases, rows = r["seconds"], r["phases"], s.druid_rows
    phase1 = phases.get("partialSegmentGeneration", 0.0) or 1e-9
    partials = int(r["partials"])
    common = {"rows_in": rows, "rows_out": r["rows_out"], "rows_md5": r["rows_md5"],
              "days": days, "partials": partials, "input_parquet_bytes": input_bytes,
              "phases_median_s": phases, "seconds_median": t,
              "seconds": {k: [x["seconds"] for x in v] for k, v in r["runs"].items()}}
    ctx.notes.append(
        f"7. Druid shape, {rows:,} rows over {days:,} days ({partials:,} partials): shuffled "
        f"{t['shuffled']:.1f} s = " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
        + f"; Spark {t['spark']:.1f} s; DuckDB {t['duckdb']:.1f} s; {r['rows_out']:,} rows "
        f"out, the same on every side (count, totals, MD5 of the sorted rows).")
    label = f"{_rows(rows)} rows, {days:,} day chunks"
    return [
        compare("druid_vs_duckdb", f"7. Druid shape ({label}): shuffled vs DuckDB (2 threads)",
                t["shuffled"], t["duckdb"], "s", "<=", 3.0, **common),
        compare("druid_vs_spark", f"7. Druid shape ({label}): shuffled vs Spark groupBy",
                t["shuffled"], t["spark"], "s", "<=", 0.3),
        absolute("druid_phase1", f"7. Druid shape ({label}): phase 1 input rows/s",
                 rows / phase1, "rows/s", ">=", 1_000_000, phase1_s=phase1),
        info("druid_partials", f"7. Druid shape ({label}): partial segments shuffled",
             partials, "partials", bytes_shuffled=r["bytes_shuffled"]),
    ]
