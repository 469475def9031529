"""Sketch metrics (Druid's ``HLLSketchBuild``, ``thetaSketch``, ``quantilesDoublesSketch``)
built and merged with Apache DataSketches (the ``datasketches`` package, imported when a
sketch metric is used), stored as each sketch's serialized bytes.

Phase 1 builds one sketch per rolled-up row from the input values of its rows; phase 2 (and
phase 1's combine of partials) merges the serialized sketches of the rows that combine: an
HLL union of ``lgK`` giving ``tgtHllType``, a theta union of ``lgK`` (``size`` = 2^lgK), a
quantiles merge of ``k``. The bytes are the library's compact serialization, the formats
Druid's DataSketches extension stores. Nulls (and NaN for quantiles) are not added, so a row
whose values are all null holds an empty sketch, as in Druid. A row that combines with no
other keeps its bytes untouched.

HLL and theta hash each value's text as UTF-8 (Druid's ``stringEncoding: UTF8``; Druid's
default UTF16LE hashes UTF-16 code units, so the same strings hash differently there).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SKETCHES = ("hll", "theta", "quantiles")
HLL_TYPES = ("HLL_4", "HLL_6", "HLL_8")


def _ds() -> Any:
    import datasketches

    return datasketches


def _new(kind: str, size: int, tgt: str) -> Any:
    ds = _ds()
    if kind == "hll":
        return ds.hll_sketch(size, getattr(ds.tgt_hll_type, tgt))
    if kind == "theta":
        return ds.update_theta_sketch(size)
    return ds.quantiles_doubles_sketch(size)


def _bytes(kind: str, sketch: Any) -> bytes:
    if kind == "hll":
        return bytes(sketch.serialize_compact())
    if kind == "theta":
        return bytes(sketch.compact().serialize())
    return bytes(sketch.serialize())


def _members(groups: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of every group, flat, and each group's start in them (plus the end)."""
    offsets = groups.offsets.to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(groups).to_numpy(zero_copy_only=False)
    return flat, offsets - offsets[0]


def build(kind: str, size: int, tgt: str, values: pa.Array | pa.ChunkedArray,
          groups: pa.ListArray) -> pa.Array:
    """One serialized sketch per group of ``groups`` (row indices into ``values``)."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    rows, starts = _members(groups)
    if kind == "quantiles":
        arr = values.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    else:
        arr = np.asarray(values.cast(pa.string()).to_pylist(), dtype=object)
    out = []
    for lo, hi in zip(starts[:-1], starts[1:]):
        sketch = _new(kind, size, tgt)
        vals = arr[rows[lo:hi]]
        if kind == "quantiles":
            vals = vals[~np.isnan(vals)]
            if len(vals):
                sketch.update(vals)
        else:
            for v in vals:
                if v is not None:
                    sketch.update(v)
        out.append(_bytes(kind, sketch))
    return pa.array(out, pa.binary())


def merge(kind: str, size: int, tgt: str, sketches: pa.Array | pa.ChunkedArray,
          groups: pa.ListArray) -> pa.Array:
    """The union (merge) of each group's serialized sketches, serialized."""
    if isinstance(sketches, pa.ChunkedArray):
        sketches = sketches.combine_chunks()
    rows, starts = _members(groups)
    ds = _ds()
    out: list[bytes | None] = []
    for lo, hi in zip(starts[:-1], starts[1:]):
        members = [sketches[int(i)].as_py() for i in rows[lo:hi]]
        present = [m for m in members if m is not None]
        if len(present) <= 1:
            out.append(present[0] if present else None)
            continue
        if kind == "hll":
            union = ds.hll_union(size)
            for m in present:
                union.update(ds.hll_sketch.deserialize(m))
            out.append(bytes(union.get_result(getattr(ds.tgt_hll_type, tgt)).serialize_compact()))
        elif kind == "theta":
            union = ds.theta_union(size)
            for m in present:
                union.update(ds.compact_theta_sketch.deserialize(m))
            out.append(bytes(union.get_result().serialize()))
        else:
            merged = ds.quantiles_doubles_sketch(size)
            for m in present:
                merged.merge(ds.quantiles_doubles_sketch.deserialize(m))
            out.append(bytes(merged.serialize()))
    return pa.array(out, pa.binary())
