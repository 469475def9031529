"""Comparisons 7 and 9: the Druid shape, ten years of ``day`` segments (thousands of time
chunks, two shards each), from Parquet (7) and from newline-delimited JSON (9).

The same three sides as comparison 5 on :mod:`bench.druid_data` (a few million rows over
3,652 day time chunks, hour query granularity, four string dimensions of which a user id
of 100,000 values, count + longSum, hashed partitioning numShards 2) or its JSON form
(:mod:`bench.druid_json_data`): shuffled's ingestion (``shuffled.api.ingest``, embedded
daemon), Spark's own groupBy + Parquet write on the same local[2] session, and DuckDB's
GROUP BY + COPY TO Parquet with 2 threads. Equal work: every side writes one output per
day (Spark ``partitionBy``, DuckDB ``PARTITION_BY``; shuffled one segment per day and
shard, as Druid does), and the table says how many files each wrote. Every side's output
is checked to hold the same rows (count, metric totals, MD5 of the sorted rows). Phase 1's
input rows per second come from the task report (``phases.partialSegmentGeneration``), as
does the number of flushes shuffled (slabs, or partials from the JVM reader).
"""

from __future__ import annotations

from typing import Any

from bench import druid_data, druid_json_data
from bench.context import Ctx
from bench.e2e import run_shape
from bench.stats import Result, absolute, compare, info

ICEBERG_TARGET = 1.2  # issue 26: publishing to Iceberg <= 1.2x publishing to a directory

_PUBLISHED_TO = {"shuffled": "to a directory", "shuffled_iceberg": "to Iceberg"}


def _rows(n: int) -> str:
    """``3M`` / ``20k`` for titles."""
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1000:g}k"


def _shape(ctx: Ctx, number: int, shape: str, module: Any, source: str,
           targets: dict[str, float]) -> list[Result]:
    s = ctx.sizes
    base = ctx.scratch(shape)
    data = base / "data"
    days = s.druid_days
    input_bytes = module.generate(data, s.druid_rows, days)
    r = run_shape(ctx, shape, data, s.druid_rows, s.e2e_repeats)
    t, phases, rows = r["seconds"], r["phases"], s.druid_rows
    phase1 = phases.get("partialSegmentGeneration", 0.0) or 1e-9
    partials, slabs = int(r["partials"]), int(r.get("slabs") or 0)
    files = r["files"]
    common = {"rows_in": rows, "rows_out": r["rows_out"], "rows_md5": r["rows_md5"],
              "days": days, "partials": partials, "slabs": slabs, "input_bytes": input_bytes,
              "files": files, "phases_median_s": phases, "seconds_median": t,
              "seconds": {k: [x["seconds"] for x in v] for k, v in r["runs"].items()}}
    ctx.notes.append(
        f"{number}. Druid shape from {source}, {rows:,} rows over {days:,} days ({partials:,} "
        f"partials, {slabs:,} slabs): shuffled {t['shuffled']:.1f} s = "
        + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
        + f"; Spark {t['spark']:.1f} s; DuckDB {t['duckdb']:.1f} s; {r['rows_out']:,} rows "
        f"out, the same on every side (count, totals, MD5 of the sorted rows); files written: "
        + ", ".join(f"{k} {v:,}" for k, v in files.items()) + ".")
    label = f"{source}, {_rows(rows)} rows, {days:,} day chunks"
    return [
        compare(f"{shape}_vs_duckdb", f"{number}. Druid shape ({label}): shuffled vs DuckDB "
                f"(2 threads), one output per day", t["shuffled"], t["duckdb"], "s", "<=",
                targets["duckdb"], **common),
        compare(f"{shape}_vs_spark", f"{number}. Druid shape ({label}): shuffled vs Spark "
                f"groupBy + partitionBy", t["shuffled"], t["spark"], "s", "<=", targets["spark"]),
        absolute(f"{shape}_phase1", f"{number}. Druid shape ({label}): phase 1 input rows/s",
                 rows / phase1, "rows/s", ">=", targets["phase1"], phase1_s=phase1),
        # numShards read natively goes as slabs (one per flush), the JVM reader's as partials
        info(f"{shape}_partials", f"{number}. Druid shape ({label}): flushes shuffled "
             f"({'slabs' if slabs else 'partial segments'})", slabs or partials,
             "slabs" if slabs else "partials", bytes_shuffled=r["bytes_shuffled"]),
        info(f"{shape}_files", f"{number}. Druid shape ({label}): files written "
             f"(shuffled / Spark / DuckDB)", files.get("shuffled", 0), "files",
             spark=files.get("spark"), duckdb=files.get("duckdb")),
    ]


def run(ctx: Ctx) -> list[Result]:
    """Comparison 7 (Parquet input): wall-time ratios to DuckDB and Spark, phase 1 rows/s."""
    # Issue 36's targets for numShards (the earlier rounds' were 2.5x and 0.3x).
    return _shape(ctx, 7, "druid", druid_data, "Parquet",
                  {"duckdb": 1.25, "spark": 0.25, "phase1": 1_000_000})


def run_json(ctx: Ctx) -> list[Result]:
    """Comparison 9 (JSON lines): the same, Spark given the schema."""
    return _shape(ctx, 9, "druid_json", druid_json_data, "JSON",
                  {"duckdb": 1.25, "spark": 0.25, "phase1": 500_000})


def run_iceberg(ctx: Ctx) -> list[Result]:
    """Comparison 11: comparison 7's ingestion published as an Apache Iceberg table (the
    embedded SQLite catalog, a local warehouse: one commit of every segment) against the
    same ingestion published to a directory (manifest.json), alternated on one session."""
    s = ctx.sizes
    data = ctx.scratch("iceberg") / "data"
    druid_data.generate(data, s.druid_rows, s.druid_days)
    r = run_shape(ctx, "druid", data, s.druid_rows, s.e2e_repeats,
                  sides=("shuffled", "shuffled_iceberg"))
    t = r["seconds"]
    publish = {k: [x["phases"].get("publish", 0.0) for x in v] for k, v in r["runs"].items()}
    ctx.notes.append(
        f"11. Druid shape published as an Iceberg table: {t['shuffled_iceberg']:.1f} s vs "
        f"{t['shuffled']:.1f} s to a directory; publish phase (s) "
        # Side names spelled out: "shuffled_iceberg" in docs reads as a metric name.
        + ", ".join(f"{_PUBLISHED_TO.get(k, k)} {v}" for k, v in publish.items())
        + f"; {r['files'].get('shuffled_iceberg', 0):,} data files in one commit, the same rows "
        "on both sides (count, totals, MD5 of the sorted rows).")
    return [compare("iceberg_vs_dir", f"11. Druid shape (Parquet, {_rows(s.druid_rows)} rows, "
                    f"{s.druid_days:,} day chunks): publishing to an Iceberg table vs to a "
                    "directory", t["shuffled_iceberg"], t["shuffled"], "s", "<=",
                    ICEBERG_TARGET, publish_s=publish, files=r["files"],
                    seconds={k: [x["seconds"] for x in v] for k, v in r["runs"].items()})]
