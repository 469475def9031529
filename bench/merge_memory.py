"""Comparison 8: merging one partition bigger than the merge task's memory budget.

Ours (the range-splitting merge of phase 2, :mod:`shuffled.spark.phase2.spill`) against
DuckDB's out-of-core GROUP BY + ORDER BY with ``memory_limit`` at the same budget, each in a
fresh process on one thread, alternated; both write the sorted, rolled-up Parquet segment.
Figures: seconds and the process's RSS growth (VmHWM, from /proc). The partition is
``merge_rows`` rows no rollup folds (about 100 bytes each in Arrow), ``merge_budget`` the
budget; the sides must agree on rows and the clicks total.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench import merge_data
from bench.context import MiB, Ctx
from bench.stats import Result, absolute, alternate, compare, median


def _side(name: str, path: str, out: str, budget: int) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-m", "bench.merge_worker", name, path, out,
                           str(budget)], capture_output=True, text=True, timeout=900,
                          check=False)
    if proc.returncode:
        raise RuntimeError(f"{name} failed: {proc.stderr.strip()[-600:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(ctx: Ctx) -> list[Result]:
    s = ctx.sizes
    base = ctx.scratch("merge")
    path = base / "partition.arrow"
    size = merge_data.write(path, s.merge_rows)
    budget = s.merge_budget
    sides = {name: (lambda n=name: _side(n, str(path), str(base / f"{n}.parquet"), budget))
             for name in ("shuffled", "duckdb")}
    got = alternate(sides, s.repeats if ctx.quick else 3)
    for figure in ("rows", "clicks"):
        if set(got["shuffled"][figure]) != set(got["duckdb"][figure]):
            raise RuntimeError(f"the sides disagree on {figure}: {got}")
    detail = {"rows": s.merge_rows, "partition_bytes": size, "budget_mib": budget / MiB,
              "samples": got}
    ours_s, duck_s = median(got["shuffled"]["seconds"]), median(got["duckdb"]["seconds"])
    ours_m = median(got["shuffled"]["growth_mib"])
    return [
        compare("merge_seconds", f"8. merge a {size // MiB} MiB partition in a "
                f"{budget // MiB} MiB budget: time vs DuckDB out-of-core", ours_s, duck_s,
                "s", "<=", 1.0, **detail),
        compare("merge_rss", "8. same: RSS growth vs DuckDB's", ours_m,
                median(got["duckdb"]["growth_mib"]), "MiB", None, None),
        absolute("merge_rss_budget", "8. same: RSS growth within budget + 100 MiB", ours_m,
                 "MiB", "<=", budget / MiB + 100),
    ]
