"""The end-to-end input: N generated rows as Parquet, written once and read by both sides.

Two days of timestamps (48 hours at hour query granularity), three string dimensions of
moderate cardinality (country 100, city 1,000 with each city in one country, device 50)
and two metrics (clicks long, revenue double). The keys are uniform, so perfect rollup
folds the rows into at most 48 x 1,000 x 50 = 2.4M groups (about 2.2M for 10M rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DAY_MS = 86_400_000
T0 = 1_514_764_800_000  # 2018-01-01T00:00:00Z
DAYS = 2
CITIES, COUNTRIES, DEVICES = 1000, 100, 50
FILES = 4


def generate(directory: Path, rows: int, seed: int = 7) -> int:
    """Write ``rows`` rows in ``FILES`` Parquet files under ``directory``; bytes written."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    city_names = pa.array([f"city-{i:04d}" for i in range(CITIES)])
    country_names = pa.array([f"country-{i:03d}" for i in range(COUNTRIES)])
    device_names = pa.array([f"device-{i:02d}" for i in range(DEVICES)])
    city_country = rng.integers(0, COUNTRIES, CITIES)
    written = 0
    per = -(-rows // FILES)
    for f in range(FILES):
        n = min(per, rows - f * per)
        if n <= 0:
            break
        city = rng.integers(0, CITIES, n)
        table = pa.table({
            "ts": pa.array(T0 + rng.integers(0, DAYS * DAY_MS, n), pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")),
            "country": _strings(country_names, city_country[city]),
            "city": _strings(city_names, city),
            "device": _strings(device_names, rng.integers(0, DEVICES, n)),
            "clicks": pa.array(rng.integers(0, 100, n), pa.int64()),
            "revenue": pa.array(np.round(rng.random(n) * 10, 2), pa.float64()),
        })
        path = directory / f"part-{f:02d}.parquet"
        pq.write_table(table, path, row_group_size=1 << 20)
        written += path.stat().st_size
    return written


def _strings(names: pa.Array, index: np.ndarray) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(index, pa.int32()), names).cast(pa.string())


def spec(directory: Path, num_shards: int = 2) -> dict[str, Any]:
    """The Druid ``index_parallel`` spec ingesting ``directory`` with perfect rollup."""
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "bench_e2e",
                "timestampSpec": {"column": "ts", "format": "auto"},
                "dimensionsSpec": {"dimensions": ["country", "city", "device"]},
                "metricsSpec": [
                    {"type": "count", "name": "count"},
                    {"type": "longSum", "name": "clicks", "fieldName": "clicks"},
                    {"type": "doubleSum", "name": "revenue", "fieldName": "revenue"},
                ],
                "granularitySpec": {
                    "type": "uniform", "segmentGranularity": "day", "queryGranularity": "hour",
                    "rollup": True, "intervals": ["2018-01-01/2018-01-03"],
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
                "partitionsSpec": {"type": "hashed", "numShards": num_shards},
                "maxNumConcurrentSubTasks": 2, "totalNumMergeTasks": 2 * num_shards,
            },
        },
    }
