"""Child process of comparisons 5 and 7: one SparkSession, every side alternately, JSON out.

    python -m bench.e2e_worker --shape e2e|druid|druid_json --data DIR --workdir DIR --repeats N --out FILE
        [--variant NAME=PARTITIONS_JSON ...] [--check-every-run]

Sides: ``shuffled.api.ingest``, Spark's own groupBy + Parquet write, and DuckDB's GROUP BY +
COPY TO Parquet (2 threads: the best single-node engine on this machine). After the runs,
every side's output is checked to hold the same rows (by DuckDB: the row count, metric
totals, and an MD5 over every row printed canonically and sorted).

The session is local[2] on loopback (driver host/bind 127.0.0.1, SPARK_LOCAL_IP), session
time zone UTC, UI on loopback (its REST API gives the shuffle bytes). ``shuffled.api.ingest``
reuses the active session, so both sides run on the same JVM with the same settings.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench import druid_data, druid_json_data, e2e_data
from shuffled.spark.driver.sparksession import worker_conf

SHAPES = {"e2e": e2e_data, "druid": druid_data, "druid_json": druid_json_data}
DAY = "__day"  # the baselines' partition column: one output directory per day


def session(extra: dict[str, str] | None = None) -> SparkSession:
    """local[2] on loopback, with the settings shuffled's own session would have, plus
    ``extra`` Spark settings (``--conf``; both sides share them)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in {**worker_conf(), **(extra or {})}.items():
        builder = builder.config(key, value)
    return (builder.appName("shuffled-bench-e2e").master("local[2]")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.pyspark.driver.python", sys.executable)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


def shuffle_write_bytes(spark: SparkSession) -> int:
    """Shuffle bytes written by every completed stage so far (Spark's REST API)."""
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages?status=complete"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return sum(int(s.get("shuffleWriteBytes", 0)) for s in json.load(resp))


def _metrics(shape: Any) -> dict[str, str]:
    names = [m["name"] for m in shape.spec(Path("."))["spec"]["dataSchema"]["metricsSpec"]]
    return {n: "count(*)" if n == "count" else f"sum({n})" for n in names}


def spark_rollup(spark: SparkSession, shape: Any, data: Path, out: Path) -> dict[str, Any]:
    """A baseline: the same perfect rollup by Spark's own shuffle, written as Parquet."""
    read = getattr(shape, "spark_read", None)
    df = read(spark, data) if read else spark.read.parquet(str(data))
    dims = shape.spec(data)["spec"]["dataSchema"]["dimensionsSpec"]["dimensions"]
    aggs = [F.count(F.lit(1)).alias(n) if n == "count" else F.sum(n).alias(n)
            for n in _metrics(shape)]
    rolled = (df.withColumn("__time", F.date_trunc("hour", F.col("ts")))
              .groupBy("__time", *dims).agg(*aggs))
    # One output per segment-granularity bucket (a day), as a user who needs time-chunked
    # segments writes it: rows of a day brought to one task, then partitionBy.
    rolled = rolled.withColumn(DAY, F.date_format(F.col("__time"), "yyyy-MM-dd"))
    rolled.repartition(DAY).write.mode("overwrite").partitionBy(DAY).parquet(str(out))
    return {}


def duckdb_rollup(spark: SparkSession, shape: Any, data: Path, out: Path) -> dict[str, Any]:
    """A baseline: the same rollup by DuckDB on one node (2 threads), to Parquet."""
    import duckdb

    dims = shape.spec(data)["spec"]["dataSchema"]["dimensionsSpec"]["dimensions"]
    aggs = ", ".join(f"{e} AS {n}" for n, e in _metrics(shape).items())
    cols = ", ".join(f'"{d}"' for d in dims)
    source = (shape.duckdb_source(data) if hasattr(shape, "duckdb_source")
              else f"read_parquet('{data}/*.parquet')")
    out.mkdir(parents=True, exist_ok=True)
    with duckdb.connect() as con:
        con.execute("SET threads = 2")
        con.execute("SET TimeZone = 'UTC'")  # hour buckets in UTC, like the other sides
        # One output per day (PARTITION_BY), like the other sides' time-chunked segments.
        con.execute(f"COPY (SELECT date_trunc('hour', ts) AS __time, {cols}, {aggs}, "
                    f"strftime(date_trunc('hour', ts), '%Y-%m-%d') AS {DAY} "
                    f"FROM {source} GROUP BY ALL) "
                    f"TO '{out}' (FORMAT PARQUET, PARTITION_BY ({DAY}))")
    return {}


def shuffled_rollup(spark: SparkSession, shape: Any, data: Path, out: Path,
                    output: str | None = None,
                    partitions: dict[str, Any] | None = None) -> dict[str, Any]:
    """``shuffled.api.ingest`` with its embedded daemon; the task report's figures.
    ``partitions``: another partitionsSpec than the shape's (a ``--variant`` side)."""
    from shuffled.api import ingest

    spec = shape.spec(data, partitions=partitions) if partitions else shape.spec(data)
    result = ingest(spec, output=output or str(out))
    report = result.report
    determined = report["phases"].get("determinePartitions", {})
    return {"bytesShuffled": report.get("bytesShuffled"),
            "determineMethod": determined.get("method"),
            "slabs": report["phases"].get("partialSegmentGeneration", {}).get("slabs"),
            "bytesFetched": report.get("bytesFetched"),
            "rowsOut": report.get("rowsOut"),
            "phases": {k: v.get("ingest/task/time", 0) / 1000 for k, v in report["phases"].items()},
            "partials": report["phases"].get("partialSegmentGeneration", {}).get("partials"),
            # Phase 2's task seconds, summed over its segments: less noisy than its wall
            # time, which carries this VM's file-creation waits (docs/benchmarks.md).
            "phase2TaskSeconds": {k: report["phases"].get("partialSegmentMerge", {}).get(
                f"{k}Seconds") for k in ("fetch", "merge", "write")},
            "rowsIn": report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]["processed"]}


def shuffled_iceberg_rollup(spark: SparkSession, shape: Any, data: Path,
                            out: Path) -> dict[str, Any]:
    """The same ingestion published as an Apache Iceberg table (the embedded default
    catalog, its SQLite file and warehouse under ``out``): one commit of every segment."""
    os.environ["SHUFFLED_ICEBERG_HOME"] = str(out)
    return shuffled_rollup(spark, shape, data, out, output="iceberg://bench/bench.rollup")


def _row_text(shape: Any) -> str:
    """A DuckDB expression printing one output row canonically: ``__time`` as epoch
    milliseconds, the dimensions, integer metrics as integers, double ones to 4 places."""
    spec = shape.spec(Path("."))["spec"]["dataSchema"]
    dims = spec["dimensionsSpec"]["dimensions"]
    mets = [f"printf('%.4f', {m['name']})" if m["type"].startswith("double")
            else f"CAST({m['name']} AS BIGINT)" for m in spec["metricsSpec"]]
    cols = ["epoch_ms(CAST(__time AS TIMESTAMP))", *(f"coalesce({d}, '')" for d in dims), *mets]
    return "concat_ws('|', " + ", ".join(cols) + ")"


def totals(out: Path, shape: Any) -> list[Any]:
    """Rows, metric totals and the MD5 of all rows sorted (one canonical line each) of a
    side's Parquet output; DuckDB reads every file, in UTC."""
    import duckdb

    sums = ", ".join(f"round(sum({n}), 2)" for n in _metrics(shape))
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        return list(con.execute(
            f"SELECT count(*), {sums}, md5(string_agg(line, chr(10) ORDER BY line)) FROM "
            f"(SELECT *, {_row_text(shape)} AS line FROM read_parquet('{out}/**/*.parquet'))"
        ).fetchone())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.e2e_worker")
    p.add_argument("--shape", choices=list(SHAPES), default="e2e")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--sides", default="shuffled,spark,duckdb",
                   help="comma-separated: shuffled, spark, duckdb, shuffled_iceberg, or a "
                        "--variant's name")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                   help="a side NAME: shuffled ingesting with the partitionsSpec JSON")
    p.add_argument("--check-every-run", action="store_true",
                   help="check each run's output (untimed), not only the last one's")
    args = p.parse_args(argv)
    spark = session(dict(c.split("=", 1) for c in args.conf))
    shape = SHAPES[args.shape]
    every: dict[str, Any] = {"shuffled": shuffled_rollup, "spark": spark_rollup,
                             "duckdb": duckdb_rollup, "shuffled_iceberg": shuffled_iceberg_rollup}
    for item in args.variant:
        name, _, text = item.partition("=")
        every[name] = functools.partial(shuffled_rollup, partitions=json.loads(text))
    sides = {k: every[k] for k in args.sides.split(",")}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    last: dict[str, Path] = {}
    # Every run writes a folder of its own, and no output is deleted until the runs are
    # over: on this machine's ext4 (no journal) a create skips the inodes freed moments
    # before, one by one, so a side run right after another's outputs were deleted paid
    # for them (DuckDB's runs drifted 3.5-8.9 s). Leftovers of an earlier invocation go
    # first, untimed.
    for stale in args.workdir.glob("out-*"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        for i in range(args.warmup + args.repeats):
            for name in (list(sides) if i % 2 == 0 else list(sides)[::-1]):  # alternate
                out = last[name] = args.workdir / f"out-{name}-{i}"
                shuffled_before = shuffle_write_bytes(spark)
                began = time.perf_counter()
                facts = sides[name](spark, shape, args.data, out)
                facts["seconds"] = time.perf_counter() - began
                facts["sparkShuffleWriteBytes"] = shuffle_write_bytes(spark) - shuffled_before
                facts["warmup"] = i < args.warmup
                facts["files"] = sum(1 for _ in out.rglob("*.parquet"))
                if args.check_every_run:
                    facts["totals"] = totals(out, shape)
                rest = {k: v for k, v in facts.items() if k not in ("seconds", "totals")}
                print(f"e2e: {name} {'warm-up ' if facts['warmup'] else ''}"
                      f"{facts['seconds']:.1f} s {json.dumps(rest)}", flush=True)
                runs[name].append(facts)
        # Untimed check that every side computed the same rollup.
        rows = {name: totals(last[name], shape) for name in sides}
    finally:
        spark.stop()
        for done in args.workdir.glob("out-*"):
            shutil.rmtree(done, ignore_errors=True)
    args.out.write_text(json.dumps({"runs": runs, "rowsOut": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
