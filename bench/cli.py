"""``python -m bench``: run the comparisons, print the table, write results and docs/benchmarks.md."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from bench import report
from bench.context import FULL, QUICK, Ctx
from bench.stats import Result, failed

HERE = Path(__file__).resolve().parent
#: comparison name -> module (each has ``run(ctx) -> list[Result]``), in run order.
COMPARISONS = {
    "serve_large": "bench.serve_large",
    "serve_small": "bench.serve_small",
    "ingest": "bench.ingest",
    "tokens": "bench.tokens",
    "memory": "bench.memory",
    "e2e": "bench.e2e",
    "druid": "bench.druid",
    "druid_json": "bench.druid:run_json",
    "iceberg": "bench.druid:run_iceberg",
    "determining": "bench.determining",
    "scale": "bench.scale",
    "merge": "bench.merge_memory",
    "deep": "bench.deep",
}


# Local mode's default 1 GiB heap makes Spark's groupBy spill on this data (2.4M groups) and
# take twice as long: give both sides room, so the baseline is Spark at its best.
DEFAULT_SPARK_CONF: tuple[str, ...] = ("spark.driver.memory=3g",)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--only", action="append", choices=list(COMPARISONS), metavar="NAME",
                   help=f"run only these comparisons (repeatable): {', '.join(COMPARISONS)}")
    p.add_argument("--skip", action="append", choices=list(COMPARISONS), metavar="NAME",
                   help="skip these comparisons (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and few repeats: a smoke test of the harness, not a benchmark")
    p.add_argument("--repeats", type=int, help="alternations per side (default 5; quick 2)")
    p.add_argument("--out", type=Path, default=None,
                   help="results file (default bench/results.json after a full run, "
                        "bench/results-partial.json after --quick/--only/--skip: a partial "
                        "run never overwrites the full run's record)")
    p.add_argument("--readme", type=Path, default=HERE.parent / "docs" / "benchmarks.md",
                   help="the page whose bench block is rewritten (default docs/benchmarks.md)")
    p.add_argument("--write-readme", action=argparse.BooleanOptionalAction, default=None,
                   help="rewrite that page's bench block (default: only after a full run, "
                        "i.e. no --quick/--only/--skip)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="Spark setting for both sides of the end-to-end comparison "
                        f"(repeatable); default: {' '.join(DEFAULT_SPARK_CONF)}")
    p.add_argument("--workdir", type=Path,
                   help="scratch directory on the disk under test (default: a new temp dir)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected comparisons; exit 0 when all ran (targets missed are reported,
    not failures), 1 when a comparison could not run."""
    args = build_parser().parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.repeats:
        from dataclasses import replace
        sizes = replace(sizes, repeats=args.repeats)
    names = [n for n in (args.only or COMPARISONS) if n not in (args.skip or [])]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    workdir = Path(tempfile.mkdtemp(prefix="shuffled-bench-", dir=args.workdir))
    bad = [c for c in args.spark_conf if "=" not in c]
    if bad:
        build_parser().error(f"--spark-conf needs KEY=VALUE, got {bad[0]!r}")
    spark_conf = tuple(args.spark_conf) or DEFAULT_SPARK_CONF
    ctx = Ctx(sizes, workdir, quick=args.quick, spark_conf=spark_conf)
    meta = {"machine": report.machine(), "quick": args.quick, "sizes": sizes.__dict__,
            "spark_conf": list(spark_conf),
            "command": "make bench" if argv is None and not sys.argv[1:]
            else "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)}
    print(f"bench: {', '.join(names)} on {report.machine_line(meta['machine'])}", flush=True)
    results: list[Result] = []
    began = time.monotonic()
    try:
        for name in names:
            t0 = time.monotonic()
            print(f"bench: {name} ...", flush=True)
            try:
                path, _, fn = COMPARISONS[name].partition(":")
                got = getattr(importlib.import_module(path), fn or "run")(ctx)
            except Exception as exc:  # one broken comparison must not hide the others
                traceback.print_exc()
                got = [failed(name, name, f"{type(exc).__name__}: {exc}")]
            results.extend(got)
            print(report.table(got), flush=True)
            print(f"bench: {name} took {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if "memory" in names:
        from bench.memory import overall
        last = max(i for i, r in enumerate(results) if r.name.startswith("memory"))
        results.insert(last + 1, overall(ctx))
    meta["seconds"] = time.monotonic() - began
    meta["notes"] = ctx.notes
    meta["daemon_peaks_mib"] = ctx.peaks
    meta["daemon_rss_split_mib"] = ctx.split
    meta["daemon_step_peaks_mib"] = ctx.steps
    print("\n" + report.table(results))
    for note in ctx.notes:
        print(f"- {note}")
    full = not (args.quick or args.only or args.skip)
    out = args.out or HERE / ("results.json" if full else "results-partial.json")
    report.write_json(out, results, meta)
    print(f"bench: wrote {out} in {meta['seconds']:.0f} s")
    if args.write_readme or (args.write_readme is None and full):
        if report.update_readme(args.readme, report.readme_block(results, meta)):
            print(f"bench: updated the table in {args.readme}")
    return 1 if report.errors(results) else 0
