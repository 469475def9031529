"""The Druid-shaped input: many ``day`` time chunks, so thousands of small partials.

Ten years of timestamps from 2015-01-01 (3,652 day segments at hour query granularity),
four string dimensions (country 100, city 1,000 each in one country, device 50, and a
high-cardinality user of 100,000 values) and two metrics (count, longSum clicks). With
hashed partitioning numShards 2 that is 7,304 partitions, each a few hundred rows: the
shape of a real multi-year Druid batch ingestion, and the one that made per-partial cost
dominate (issue 11).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DAY_MS = 86_400_000
T0 = 1_420_070_400_000  # 2015-01-01T00:00:00Z
DAYS = 3652
CITIES, COUNTRIES, DEVICES, USERS = 1000, 100, 50, 100_000
FILES = 4
INTERVAL = "2015-01-01/2025-01-01"


def generate(directory: Path, rows: int, days: int = DAYS, seed: int = 11) -> int:
    """Write ``rows`` rows over the first ``days`` days (at most ``DAYS``) in ``FILES``
    Parquet files under ``directory``; bytes written."""
    days = min(days, DAYS)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = {n: pa.array([f"{n}-{i:06d}" for i in range(k)])
             for n, k in (("city", CITIES), ("country", COUNTRIES), ("device", DEVICES),
                          ("user", USERS))}
    city_country = rng.integers(0, COUNTRIES, CITIES)
    written = 0
    per = -(-rows // FILES)
    for f in range(FILES):
        n = min(per, rows - f * per)
        if n <= 0:
            break
        city = rng.integers(0, CITIES, n)
        # Users follow a skewed distribution (a few heavy users): some rollup to do.
        user = np.minimum(rng.zipf(1.3, n) - 1, USERS - 1)
        table = pa.table({
            "ts": pa.array(np.sort(T0 + rng.integers(0, days * DAY_MS, n)), pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")),
            "country": _strings(names["country"], city_country[city]),
            "city": _strings(names["city"], city),
            "device": _strings(names["device"], rng.integers(0, DEVICES, n)),
            "user": _strings(names["user"], user),
            "clicks": pa.array(rng.integers(0, 100, n), pa.int64()),
        })
        path = directory / f"part-{f:02d}.parquet"
        pq.write_table(table, path, row_group_size=1 << 20)
        written += path.stat().st_size
    return written


def _strings(names: pa.Array, index: np.ndarray) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(index, pa.int32()), names).cast(pa.string())


DIMENSIONS = ["country", "city", "device", "user"]
METRICS = {"count": "count(*)", "clicks": "sum(clicks)"}


def spec(directory: Path, num_shards: int = 2,
         partitions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Druid ``index_parallel`` spec ingesting ``directory`` with perfect rollup;
    ``partitions`` replaces the partitionsSpec (hashed ``numShards`` by default)."""
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "bench_druid",
                "timestampSpec": {"column": "ts", "format": "auto"},
                "dimensionsSpec": {"dimensions": DIMENSIONS},
                "metricsSpec": [
                    {"type": "count", "name": "count"},
                    {"type": "longSum", "name": "clicks", "fieldName": "clicks"},
                ],
                "granularitySpec": {
                    "type": "uniform", "segmentGranularity": "day", "queryGranularity": "hour",
                    "rollup": True, "intervals": [INTERVAL],
                },
            },
            "ioConfig": {
                "type": "index_parallel",
                "inputSource": {"type": "local", "baseDir": str(directory),
                                "filter": "*.parquet"},
                "inputFormat": {"type": "parquet"},
            },
            "tuningConfig": {
                "type": "index_parallel", "forceGuaranteedRollup": True,
                "partitionsSpec": partitions or {"type": "hashed", "numShards": num_shards},
                "maxNumConcurrentSubTasks": 2, "totalNumMergeTasks": 2,
            },
        },
    }
