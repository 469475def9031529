"""Comparison 12: the determining specs (issue 36's late plan) on the Druid shape.

What Druid users write when they do not know the shard count: ``hashed`` and ``range``
(``partitionDimensions`` [country, city]) with ``targetRowsPerSegment`` and no
``numShards``. Both take the late plan (docs/ingestion.md, "Shards chosen after phase 1"):
one pass over the input, the shards chosen from the slabs' statistics, phase 2 reading key
ranges. They are measured against the same ingestion with the plan known up front
(``hashed`` ``numShards`` 2, comparison 7's spec) and against DuckDB writing one output per
day, four sides alternated on one local[2] session (:mod:`bench.e2e_worker`).

Equal work: the target is chosen so that every day gets two shards, as ``numShards`` 2
gives (the table's detail has each side's file count). Every run's output, warm-up
included, is checked to hold DuckDB's rollup (row count, metric totals, MD5 of the sorted
rows), not only the last one. Range partitioning has no ``numShards`` (Druid's neither):
its peer is the hashed ``numShards`` run, the cheapest plan known up front.
"""

from __future__ import annotations

from typing import Any

from bench import druid_data
from bench.context import Ctx
from bench.e2e import run_shape
from bench.stats import Result, compare, info

SHARDS = 2  # numShards of the peer, and the shards per day the target aims at
TARGETS = {"peer": 1.1, "duckdb": 1.4}
_NAMES = {"hashed_target": "hashed targetRowsPerSegment",
          "range_target": "range [country, city] targetRowsPerSegment",
          "hashed_shards": "hashed numShards 2"}


def target_rows(rows: int, days: int) -> int:
    """``targetRowsPerSegment`` giving ``SHARDS`` shards a day: a day holds about
    ``rows / days`` rolled-up rows (the shape hardly folds: 2,999,898 of 3M) and gets
    ``ceil(day rows / target)`` shards, so the target sits midway between half and all of
    them: a day 45% above or 27% below the average still gets two."""
    return max(1, int(0.73 * rows / days))


def variants(rows: int, days: int) -> dict[str, dict[str, Any]]:
    """The sides' partitionsSpecs."""
    target = target_rows(rows, days)
    return {
        "hashed_target": {"type": "hashed", "targetRowsPerSegment": target},
        "hashed_shards": {"type": "hashed", "numShards": SHARDS},
        "range_target": {"type": "range", "targetRowsPerSegment": target,
                         "partitionDimensions": ["country", "city"]},
    }


def run(ctx: Ctx) -> list[Result]:
    """Rows 12: each determining spec vs numShards and vs DuckDB; phase 2 and files."""
    s = ctx.sizes
    data = ctx.scratch("determining") / "data"
    druid_data.generate(data, s.druid_rows, s.druid_days)
    specs = variants(s.druid_rows, s.druid_days)
    sides = (*specs, "duckdb")
    r = run_shape(ctx, "druid", data, s.druid_rows, s.e2e_repeats, sides=sides,
                  variants=specs, check_every_run=True)
    t, files, by_side = r["seconds"], r["files"], r["phases_by_side"]
    seconds = {k: [x["seconds"] for x in v] for k, v in r["runs"].items()}
    methods = {k: sorted({x.get("determineMethod") or "-" for x in v})
               for k, v in r["runs"].items() if k != "duckdb"}
    slabs = {k: [x.get("slabs") for x in v] for k, v in r["runs"].items() if k != "duckdb"}
    label = f"Parquet, {s.druid_rows / 1e6:g}M rows, {s.druid_days:,} day chunks"
    ctx.notes.append(
        f"12. determining specs on the Druid shape ({label}; targetRowsPerSegment "
        f"{target_rows(s.druid_rows, s.druid_days):,}): "
        + "; ".join(f"{_NAMES.get(k, k)} {t[k]:.1f} s"
                    + (" = " + ", ".join(f"{p} {v:.1f} s" for p, v in by_side[k].items())
                       if k in by_side else "")
                    + f", {files.get(k, 0):,} files" for k in sides)
        + f"; {r['rows_out']:,} rows out, every run the same as DuckDB's (count, totals, MD5 "
        "of the sorted rows); determinePartitions.method: "
        + ", ".join(f"{k} {'/'.join(v)}" for k, v in methods.items()) + ".")
    common = {"rows_in": s.druid_rows, "rows_out": r["rows_out"], "rows_md5": r["rows_md5"],
              "partitions_specs": specs, "files": files, "phases_median_s": by_side,
              "seconds": seconds, "determine_method": methods, "slabs": slabs}
    out: list[Result] = []
    for side in ("hashed_target", "range_target"):
        name = side.removesuffix("_target")
        out.append(compare(f"determining_{name}_vs_shards", f"12. Druid shape ({label}): "
                           f"{_NAMES[side]} vs hashed numShards {SHARDS}", t[side],
                           t["hashed_shards"], "s", "<=", TARGETS["peer"], **common))
        out.append(compare(f"determining_{name}_vs_duckdb", f"12. Druid shape ({label}): "
                           f"{_NAMES[side]} vs DuckDB (2 threads), one output per day",
                           t[side], t["duckdb"], "s", "<=", TARGETS["duckdb"]))
    out.append(compare("determining_shards_vs_duckdb", f"12. Druid shape ({label}): "
                       f"hashed numShards {SHARDS} vs DuckDB (2 threads), one output per day",
                       t["hashed_shards"], t["duckdb"], "s", None, None))
    for side in specs:
        merge = by_side.get(side, {}).get("partialSegmentMerge")
        if merge is not None:
            out.append(info(f"determining_{side}_phase2", f"12. Druid shape ({label}): "
                            f"{_NAMES[side]}, phase 2 (merge)", merge, "s",
                            files=files.get(side)))
    return out
