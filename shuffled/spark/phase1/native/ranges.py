"""Range partitions of natively read rows: what :func:`shuffled.spark.phase1.jvm.prepare.bucket_column` gives for
``plan.kind == "range"``, computed after the task's rollup.

A row's partition in its time chunk is the number of the chunk's boundaries its key is at
or above (:func:`shuffled.spark.phase1.jvm.prepare.range_key`: per range dimension, null before any value, then the
value's UTF-8 bytes, compared dimension by dimension); a chunk without boundaries is one
partition. Vectorised: rows and boundaries are sorted together, boundaries before equal
keys, and a row's partition is the count of its chunk's boundaries sorted before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.rows.rollup import CHUNK


@dataclass(frozen=True)
class RangeBucketer:
    """``boundaries``: per chunk start, its increasing split points (one value or None
    per range dimension)."""

    dimensions: tuple[str, ...]
    boundaries: dict[int, list[tuple[str | None, ...]]] = field(default_factory=dict)

    def __call__(self, table: pa.Table) -> np.ndarray:
        """The partition (int32) of every row of ``table`` (``__chunk`` and the dimensions)."""
        n = table.num_rows
        bounds = [(c, b) for c, bs in sorted(self.boundaries.items()) for b in bs]
        if not bounds or n == 0:
            return np.zeros(n, dtype=np.int32)
        cols: dict[str, pa.Array] = {"c": pa.concat_arrays([
            table.column(CHUNK).combine_chunks().cast(pa.int64()),
            pa.array([c for c, _ in bounds], pa.int64())])}
        for i, d in enumerate(self.dimensions):
            values = table.column(d).combine_chunks()
            if pa.types.is_dictionary(values.type):
                values = values.cast(values.type.value_type)
            values = pa.concat_arrays([values.cast(pa.string()),
                                       pa.array([b[i] for _, b in bounds], pa.string())])
            cols[f"n{i}"] = pc.is_valid(values).cast(pa.int8())
            cols[f"v{i}"] = pc.fill_null(values, "")
        cols["row"] = pa.array(np.concatenate([np.ones(n, np.int8), np.zeros(len(bounds), np.int8)]))
        keys = [("c", "ascending")]
        keys += [(f"{p}{i}", "ascending") for i in range(len(self.dimensions)) for p in "nv"]
        order = pc.sort_indices(pa.table(cols), sort_keys=keys + [("row", "ascending")]).to_numpy()
        is_bound = order >= n
        before = np.cumsum(is_bound)  # boundaries at or before each sorted position
        chunks = cols["c"].to_numpy()[order]
        bound_chunks = np.array(sorted(c for c, _ in bounds), dtype=np.int64)
        earlier = np.searchsorted(bound_chunks, chunks, side="left")  # other chunks' bounds
        out = np.empty(n, dtype=np.int32)
        rows = ~is_bound
        out[order[rows]] = (before[rows] - earlier[rows]).astype(np.int32)
        return out
