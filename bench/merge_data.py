"""Comparison 8's input: one partition of rows rollup cannot fold (a unique id per row),
as phase 2 receives it, written once as an Arrow IPC file both sides read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from shuffled.spark.rows.rollup import Layout

LAYOUT = Layout((("id", "string"), ("site", "string")),
                (("count", "count", "sum", "long", None), ("clicks", "sum", "sum", "long", "c")))
# The same rollup, sorted as a segment is.
SQL = ("SELECT __time, id, site, sum(count) AS count, sum(clicks) AS clicks FROM src "
       "GROUP BY ALL ORDER BY __time, id NULLS FIRST, site NULLS FIRST")


def write(path: Path, rows: int, seed: int = 5) -> int:
    """Write ``rows`` rows in 100k-row batches (phase 1's flush size); returns the bytes."""
    rng = np.random.default_rng(seed)
    table = pa.table({
        "__time": pa.array(np.sort(rng.integers(0, 86_400_000, rows)), pa.int64()),
        "id": pa.array([f"user-{i:09d}" for i in rng.permutation(rows)]),
        "site": pa.array(rng.integers(0, 50, rows).astype(str)),
        "count": pa.array(np.ones(rows, dtype=np.int64)),
        "clicks": pa.array(rng.integers(0, 100, rows), pa.int64())})
    with pa.OSFile(str(path), "wb") as fh, ipc.new_file(fh, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=100_000):
            writer.write_batch(batch)
    return path.stat().st_size
