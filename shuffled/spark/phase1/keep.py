"""A recompute's filter: only the rows of the (time chunk, partition) keys that were lost
(docs/failover.md), so a re-run subtask uploads nothing that survived."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from shuffled.spark.rows.rollup import BUCKET, CHUNK


def only_keys(table: pa.Table, buckets: Any, keep: frozenset[tuple[int, int]],
              ) -> tuple[pa.Table, Any]:
    """The rows of ``table`` whose (chunk, partition) is in ``keep`` (vectorised: a
    recompute may keep thousands of keys of millions of rows)."""
    chunks = table.column(CHUNK).to_numpy()
    of = np.asarray(buckets if buckets is not None else table.column(BUCKET).to_numpy())
    kept_chunks = np.array(sorted({c for c, _ in keep}), dtype=chunks.dtype)
    width = int(max(int(of.max(initial=0)), max(b for _, b in keep))) + 1 if keep else 1
    # (chunk, partition) as one integer: the chunk's rank among the kept chunks, times width.
    rank = np.searchsorted(kept_chunks, chunks)
    known = (rank < len(kept_chunks)) & (kept_chunks[np.minimum(rank, len(kept_chunks) - 1)]
                                          == chunks) if len(kept_chunks) else np.zeros(
                                              len(chunks), dtype=bool)
    codes = rank.astype(np.int64) * width + of.astype(np.int64)
    wanted = np.array([int(np.searchsorted(kept_chunks, c)) * width + b for c, b in keep],
                      dtype=np.int64)
    mask = known & np.isin(codes, wanted)
    return table.filter(pa.array(mask)), (of[mask] if buckets is not None else None)
