"""Slabs for tests: a table of rows over some hour chunks, sorted and cut as phase 1 would."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shuffled.slab import build, keys, sketch
from shuffled.slab.wire import KeyKind

HOUR = 3_600_000


def rows_table(n: int, *, chunks: int = 3, seed: int = 0, dims: int = 40) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "__time": pa.array(rng.integers(0, chunks, n) * HOUR + rng.integers(0, HOUR, n),
                           pa.int64()),
        "dim": pa.array([f"d{v}" for v in rng.integers(0, dims, n)]),
        "user": pa.array([f"u{v}" for v in rng.integers(0, 1000, n)]),
        "count": pa.array(np.ones(n, np.int64)),
    })


def make_slab(table: pa.Table, *, sub: str = "sub0", slab_id: int = 0, attempt: int = 0,
              kind: KeyKind = KeyKind.HASH, batch_rows: int = 256) -> build.Slab:
    """``table`` keyed (hash of dim, or the (dim, user) tuple), sorted, cut into a slab."""
    if kind == KeyKind.HASH:
        h = np.asarray(sketch.row_hashes([table["dim"]]) >> np.uint64(32), dtype=np.uint32)
        key = keys.hash_keys(h)
    elif kind == KeyKind.TUPLE:
        key = keys.tuple_keys([table["dim"], table["user"]])
    else:
        key = None
    chunk = (table["__time"].to_numpy() // HOUR) * HOUR
    t = table if key is None else table.append_column(keys.KEY_COLUMN, key)
    sort_keys = [chunk] if key is None else [np.asarray(key.to_pylist(), dtype=object), chunk]
    order = np.lexsort(sort_keys)
    t = t.take(pa.array(order))
    chunk = chunk[order]
    return build.build(t, chunk, chunk + HOUR, kind=kind, sub_task_id=sub, slab_id=slab_id,
                       attempt=attempt, batch_rows=batch_rows,
                       rollup_hashes=sketch.row_hashes([t["dim"], t["user"]]))
