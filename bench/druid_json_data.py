"""The Druid shape from newline-delimited JSON: what most Druid users ingest.

The rows of :mod:`bench.druid_data` (ten years of ``day`` chunks, four string dimensions,
count + longSum), written as JSON lines with ISO-8601 timestamps in ``FILES`` files (DuckDB
converts the Parquet, so generating stays fast). The spec differs from the Parquet one only
in its input format and filter; Spark reads it with ``read.json`` and the schema given,
DuckDB with ``read_json`` and the columns given, as a user who knows their data would.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bench import druid_data

DIMENSIONS = druid_data.DIMENSIONS
METRICS = druid_data.METRICS


def generate(directory: Path, rows: int, days: int = druid_data.DAYS, seed: int = 11) -> int:
    """Write ``rows`` rows as JSON lines under ``directory``; bytes written."""
    import duckdb

    parquet = directory.parent / f"{directory.name}-parquet"
    druid_data.generate(parquet, rows, days, seed)
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        for i, path in enumerate(sorted(parquet.glob("*.parquet"))):
            out = directory / f"part-{i:02d}.json"
            con.execute(
                f"COPY (SELECT strftime(ts, '%Y-%m-%dT%H:%M:%S.%gZ') AS ts, country, city, "
                f"device, \"user\", clicks FROM read_parquet('{path}')) TO '{out}' "
                f"(FORMAT JSON)")
            written += out.stat().st_size
    shutil.rmtree(parquet)
    return written


def spec(directory: Path, num_shards: int = 2) -> dict[str, Any]:
    out = druid_data.spec(directory, num_shards)
    io = out["spec"]["ioConfig"]
    io["inputSource"]["filter"] = "*.json"
    io["inputFormat"] = {"type": "json"}
    out["spec"]["dataSchema"]["timestampSpec"] = {"column": "ts", "format": "iso"}
    out["spec"]["dataSchema"]["dataSource"] = "bench_druid_json"
    return out


def spark_read(spark: Any, data: Path) -> Any:
    """The input as Spark reads it, schema given (no inference pass), ``ts`` a timestamp."""
    from pyspark.sql import functions as F

    schema = ("ts STRING, country STRING, city STRING, device STRING, user STRING, "
              "clicks BIGINT")
    return (spark.read.schema(schema).json(str(data))
            .withColumn("ts", F.to_timestamp("ts")))


def duckdb_source(data: Path) -> str:
    """The input as DuckDB reads it, columns given."""
    return (f"read_json('{data}/*.json', format = 'newline_delimited', columns = "
            f"{{ts: 'TIMESTAMP', country: 'VARCHAR', city: 'VARCHAR', device: 'VARCHAR', "
            f"\"user\": 'VARCHAR', clicks: 'BIGINT'}})")
