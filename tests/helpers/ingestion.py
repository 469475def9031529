"""Fixtures, data generators and checks for the Spark pipeline tests (tests/spark/).

One SparkSession per test session (local[2,4]: 2 cores, up to 4 attempts per task so
injected failures are retried; speculation on; UI off; loopback only).
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

_SESSION: Any = None


def spark_session() -> Any:
    """The shared SparkSession (created on first use, stopped by the ``spark`` fixture at
    the end of the test session)."""
    global _SESSION
    if _SESSION is None:
        from pyspark.sql import SparkSession

        from shuffled.spark.driver.sparksession import worker_conf

        builder = SparkSession.builder
        for key, value in worker_conf().items():  # the workers as shuffled's session has them
            builder = builder.config(key, value)
        _SESSION = (
            builder.master("local[2,4]").appName("shuffled-tests")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "4")
            .config("spark.speculation", "true")
            .config("spark.sql.files.maxPartitionBytes", "256k")
            .config("spark.sql.files.openCostInBytes", "0")
            .config("spark.pyspark.python", sys.executable)
            .getOrCreate()
        )
        _SESSION.sparkContext.setLogLevel("ERROR")
    return _SESSION


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    global _SESSION
    yield spark_session()
    # Stopped before the interpreter exits: a daemon thread still running Python code at
    # exit (pyspark's accumulator server) keeps what its frames reach alive past
    # finalisation, and nanobind (DuckDB's bindings) then prints "leaked" lines after
    # pytest's summary.
    if _SESSION is not None:
        _SESSION.stop()
        _SESSION = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(location: Path, port: int = 0) -> Any:
    """A started EmbeddedDaemon (``.url``, ``.stop()``) on 127.0.0.1."""
    from shuffled.server.embedded import EmbeddedDaemon

    daemon = EmbeddedDaemon([str(location)], port=port, free_space_reserve=0)
    daemon.start()
    return daemon


def ingest_alone(spec: dict[str, Any], tmp_path: Path, **kwargs: Any) -> Any:
    """``run_ingestion`` of ``spec`` through one daemon of its own (location
    ``tmp_path/loc``, stopped afterwards), publishing under ``tmp_path/out``."""
    from shuffled.spark import run_ingestion

    daemon = start_daemon(tmp_path / "loc")
    try:
        return run_ingestion(spec, shuffle_servers=[daemon.url],
                             output_dir=str(tmp_path / "out"), **kwargs)
    finally:
        daemon.stop()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Any]]:
    """Two daemons, each with its own location; stopped at the end."""
    started = [start_daemon(tmp_path / f"loc{i}") for i in range(2)]
    yield started
    for d in started:
        d.stop()


def held_tasks(url: str) -> list[Any]:
    from shuffled.client import ShuffleClient

    with ShuffleClient(url) as c:
        return list(c.list_tasks().get("tasks", []))


# --- data -------------------------------------------------------------------------------

BASE = int(datetime(2018, 3, 1, tzinfo=timezone.utc).timestamp() * 1000)
HOUR = 3_600_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def generate(rows: int, seed: int = 1) -> tuple[list[str], list[dict[str, Any]], int]:
    """JSON lines with skewed keys, nulls, several days, some unparseable lines and some
    rows with a metric that is not a number (ingested, ``"error": True`` among the records).

    Returns (lines, ingested records, number of unparseable lines).
    """
    rnd = random.Random(seed)
    lines: list[str] = []
    good: list[dict[str, Any]] = []
    bad = 0
    weights = [1.0 / (i + 1) ** 1.3 for i in range(40)]
    for i in range(rows):
        kind = rnd.random()
        if kind < 0.01:
            lines.append('{"ts": "2018-03-01T00:00:00Z", "country": ')  # malformed JSON
            bad += 1
            continue
        if kind < 0.015:
            lines.append(json.dumps({"ts": "not a time", "country": "x", "clicks": 1}))
            bad += 1
            continue
        if kind < 0.02:
            # Not a number in a numeric metric's field: Druid ingests the row with that value
            # null and counts it processedWithError (``error`` marks it here).
            lines.append(json.dumps({"ts": iso(BASE), "country": "x", "clicks": "many"}))
            good.append({"ts": iso(BASE), "country": "x", "clicks": None, "revenue": None,
                         "ms": BASE, "error": True})
            continue
        ts = BASE + int(rnd.random() * 4 * 24 * HOUR) - 12 * HOUR
        rec = {
            "ts": iso(ts),
            "country": rnd.choices([f"c{j}" for j in range(40)], weights)[0],
            "device": None if rnd.random() < 0.15 else rnd.choice(["ios", "android", "web"]),
            "clicks": rnd.randint(0, 50),
            "revenue": round(rnd.random() * 10, 3),
        }
        if rnd.random() < 0.05:
            del rec["device"]
        lines.append(json.dumps(rec))
        good.append({**rec, "ms": ts})
    return lines, good, bad


def write_parts(lines: list[str], directory: Path, parts: int = 3) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    size = (len(lines) + parts - 1) // parts
    for p in range(parts):
        (directory / f"part-{p}.json").write_text("\n".join(lines[p * size:(p + 1) * size]) + "\n")


def json_input(base: Path, rows: int, seed: int, parts: int,
               ) -> tuple[Path, list[dict[str, Any]]]:
    """:func:`generate`'s ``rows`` as newline-delimited JSON in ``parts`` files under
    ``base/json``: that directory and the good rows (what DuckDB's rollup is made of)."""
    lines, good, _ = generate(rows, seed=seed)
    write_parts(lines, base / "json", parts=parts)
    return base / "json", good


def base_spec(base_dir: Path, partitions: dict[str, Any], **tuning: Any) -> dict[str, Any]:
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "events",
                "timestampSpec": {"column": "ts", "format": "iso"},
                "dimensionsSpec": {"dimensions": ["country", "device"]},
                "metricsSpec": [
                    {"type": "count", "name": "count"},
                    {"type": "longSum", "name": "clicks", "fieldName": "clicks"},
                    {"type": "doubleSum", "name": "revenue", "fieldName": "revenue"},
                    {"type": "longMax", "name": "max_clicks", "fieldName": "clicks"},
                    {"type": "doubleMin", "name": "min_revenue", "fieldName": "revenue"},
                ],
                "granularitySpec": {
                    "segmentGranularity": "day", "queryGranularity": "hour",
                    "intervals": ["2018-03-01/2018-03-03T06:00:00Z"], "rollup": True,
                },
            },
            "ioConfig": {
                "type": "index_parallel",
                "inputSource": {"type": "local", "baseDir": str(base_dir), "filter": "*.json"},
                "inputFormat": {"type": "json"},
            },
            "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                             "partitionsSpec": partitions, **tuning},
        },
    }


def expected_rollup(good: list[dict[str, Any]], granularity_ms: int = HOUR) -> pa.Table:
    """The rolled-up rows computed independently with DuckDB, inside the spec's intervals."""
    import duckdb

    lo = BASE
    hi = BASE + 3 * 24 * HOUR  # day buckets overlapping 2018-03-01/2018-03-03T06
    table = pa.table({
        "ms": [g["ms"] for g in good],
        "country": [g["country"] for g in good],
        "device": [g.get("device") for g in good],
        "clicks": pa.array([g["clicks"] for g in good], pa.int64()),
        "revenue": [g["revenue"] for g in good],
    })
    # Closed here, not left to the garbage collector: a DuckDB object still alive at
    # interpreter exit makes nanobind print "leaked" lines after pytest's summary.
    with duckdb.connect() as con:
        con.register("raw", table)
        return con.sql(f"""
            SELECT ms - ms % {granularity_ms} AS t, country, device, count(*) AS count,
                   sum(clicks) AS clicks, sum(revenue) AS revenue, max(clicks) AS max_clicks,
                   min(revenue) AS min_revenue
            FROM raw WHERE ms >= {lo} AND ms < {hi}
            GROUP BY ALL ORDER BY t, country NULLS FIRST, device NULLS FIRST
        """).to_arrow_table()


def read_output(out_dir: Path, data_source: str = "events") -> tuple[dict[str, Any], pa.Table]:
    """The published manifest and every segment's rows (with segment info columns)."""
    import pyarrow.parquet as pq

    ds = out_dir / data_source
    manifest = json.loads((ds / "manifest.json").read_text())
    tables = []
    for seg in manifest["segments"]:
        t = pq.read_table(ds / seg["path"])
        t = t.append_column("__seg", pa.array([f"{seg['interval']}#{seg['partitionNum']}"] * t.num_rows))
        tables.append(t)
    return manifest, pa.concat_tables(tables) if tables else pa.table({})


def _ms(table: pa.Table) -> list[int]:
    return pc.cast(pc.cast(table.column("__time"), pa.timestamp("ms")), pa.int64()).to_pylist()


def assert_matches(out: pa.Table, expected: pa.Table) -> None:
    """Same rows as the independent rollup; no (time, dimensions) key twice."""
    rows = sorted(zip(_ms(out), out.column("country").to_pylist(), out.column("device").to_pylist(),
                      *(out.column(c).to_pylist() for c in ("count", "clicks", "revenue",
                                                             "max_clicks", "min_revenue"))),
                  key=lambda r: (r[0], r[1] or "", r[2] is not None, r[2] or ""))
    keys = [r[:3] for r in rows]
    assert len(keys) == len(set(keys)), "a (time, dimensions) key appears twice"
    exp = expected.to_pylist()
    exp.sort(key=lambda r: (r["t"], r["country"] or "", r["device"] is not None, r["device"] or ""))
    assert len(rows) == len(exp)
    for got, want in zip(rows, exp):
        assert got[:5] == (want["t"], want["country"], want["device"], want["count"], want["clicks"])
        if want["revenue"] is None:  # only rows whose metrics were not numbers: null
            assert got[5] is None
        else:
            assert math.isclose(got[5], want["revenue"], rel_tol=1e-9, abs_tol=1e-9)
        assert got[6] == want["max_clicks"] and got[7] == want["min_revenue"]


def by_interval(segments: dict[tuple[str, int], tuple[Any, list[Any]]],
                ) -> dict[str, list[str]]:
    """Each interval's rows (sorted, as JSON), whatever shards they are in: what two
    readers must agree on when the shards are chosen differently (the native reader's
    late plan cuts hash or key ranges from its slabs' statistics, docs/slab.md; the JVM
    reader counts with a first pass and cuts Druid's way), each cut being checked by the
    tests of its own path."""
    import json as _json

    out: dict[str, list[str]] = {}
    for (interval, _), (_, rows) in segments.items():
        out.setdefault(interval, []).extend(_json.dumps(r, sort_keys=True, default=str)
                                            for r in rows)
    return {k: sorted(v) for k, v in out.items()}
