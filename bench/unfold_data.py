"""Input whose keys never fold: every row its own rolled-up row (random ids, millisecond
query granularity). The worst case for phase 1's memory: nothing combines, so every row
read is held, cut and shipped, and phase 2 merges as many rows as came in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

T0 = 1_514_764_800_000  # 2018-01-01T00:00:00Z
DAY_MS = 86_400_000
FILES = 4


def generate(directory: Path, rows: int, seed: int = 5, row_group: int = 1 << 20) -> int:
    """``rows`` rows over one day in ``FILES`` Parquet files; bytes written."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = 0
    per = -(-rows // FILES)
    for f in range(FILES):
        n = min(per, rows - f * per)
        if n <= 0:
            break
        ids = rng.integers(0, 1 << 62, n)
        table = pa.table({
            "ts": pa.array(T0 + rng.integers(0, DAY_MS, n), pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")),
            "id": pa.array(np.char.add("id-", ids.astype(str))),
            "site": pa.array(np.char.add("site-", (ids % 1000).astype(str))),
            "value": pa.array(rng.integers(0, 1000, n), pa.int64()),
        })
        path = directory / f"part-{f:02d}.parquet"
        pq.write_table(table, path, row_group_size=row_group)
        written += path.stat().st_size
    return written


def spec(directory: Path, max_bytes: int = 256 << 20) -> dict[str, Any]:
    return {
        "type": "index_parallel",
        "spec": {
            "dataSchema": {
                "dataSource": "unfoldable",
                "timestampSpec": {"column": "ts", "format": "auto"},
                "dimensionsSpec": {"dimensions": ["id", "site"]},
                "metricsSpec": [{"type": "count", "name": "count"},
                                {"type": "longSum", "name": "value", "fieldName": "value"}],
                "granularitySpec": {"segmentGranularity": "day", "queryGranularity": "none",
                                    "rollup": True, "intervals": ["2018-01-01/2018-01-02"]},
            },
            "ioConfig": {"type": "index_parallel",
                         "inputSource": {"type": "local", "baseDir": str(directory),
                                         "filter": "*.parquet"},
                         "inputFormat": {"type": "parquet"}},
            "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                             "partitionsSpec": {"type": "hashed", "numShards": 4},
                             "maxBytesInMemory": max_bytes},
        },
    }
