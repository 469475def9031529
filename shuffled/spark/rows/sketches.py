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


def _codes(values: pa.Array, kind: str) -> tuple[np.ndarray, pa.Array]:
    """Each value's code in a dictionary of the distinct values (-1: null, or NaN for
    quantiles, which are never added), and that dictionary."""
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if kind == "quantiles":
        values = values.cast(pa.float64())
        values = pc.if_else(pc.is_nan(values), pa.scalar(None, pa.float64()), values)
    else:
        values = values.cast(pa.string())
    encoded = pc.dictionary_encode(values).combine_chunks() if isinstance(
        values, pa.ChunkedArray) else pc.dictionary_encode(values)
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary


def _add(kind: str, sketch: Any, values: list[Any]) -> None:
    if kind == "quantiles":
        if values:
            sketch.update(np.asarray(values, dtype=np.float64))
        return
    for v in values:
        sketch.update(v)


def build(kind: str, size: int, tgt: str, values: pa.Array | pa.ChunkedArray,
          groups: pa.ListArray) -> pa.Array:
    """One serialized sketch per group of ``groups`` (row indices into ``values``).

    Most rolled-up rows of high-cardinality input hold one distinct value (HLL, theta: the
    set is what counts) or one row (quantiles: the count matters too): such a group's
    sketch is the one-value sketch, built once per distinct value and taken by index; only
    the other groups are built one by one."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    codes, dictionary = _codes(values, kind)
    rows, starts = _members(groups)
    member = codes[rows]
    firsts = starts[:-1]
    if len(member):
        lo = np.minimum.reduceat(member, firsts) if len(firsts) else np.empty(0, np.int64)
        hi = np.maximum.reduceat(member, firsts) if len(firsts) else np.empty(0, np.int64)
    else:
        lo = hi = np.full(len(firsts), -1, dtype=np.int64)
    sizes = np.diff(starts)
    simple = (lo == hi) if kind != "quantiles" else ((sizes == 1) | (hi == -1))
    simple &= sizes > 0
    distinct = dictionary.to_pylist()
    # Bodies: [empty sketch, one sketch per distinct value used by a simple group, others].
    bodies: list[bytes] = [_bytes(kind, _new(kind, size, tgt))]
    index = np.zeros(len(firsts), dtype=np.int64)
    used = np.unique(lo[simple & (lo >= 0)])
    slot = np.full(len(distinct) + 1, 0, dtype=np.int64)
    for code in used.tolist():
        sketch = _new(kind, size, tgt)
        _add(kind, sketch, [distinct[code]])
        slot[code] = len(bodies)
        bodies.append(_bytes(kind, sketch))
    index[simple] = slot[lo[simple]]  # lo == -1 (all null) maps to slot[-1] == 0: empty
    for g in np.nonzero(~simple)[0].tolist():
        sketch = _new(kind, size, tgt)
        present = member[starts[g]:starts[g + 1]]
        _add(kind, sketch, [distinct[c] for c in present.tolist() if c >= 0])
        index[g] = len(bodies)
        bodies.append(_bytes(kind, sketch))
    return pa.array(bodies, pa.binary()).take(pa.array(index))


def merge(kind: str, size: int, tgt: str, sketches: pa.Array | pa.ChunkedArray,
          groups: pa.ListArray) -> pa.Array:
    """The union (merge) of each group's serialized sketches, serialized. A group of one
    sketch keeps its bytes; HLL and theta groups whose sketches are byte-identical too (a
    union of a set with itself); only the others are unioned one by one."""
    if isinstance(sketches, pa.ChunkedArray):
        sketches = sketches.combine_chunks()
    rows, starts = _members(groups)
    sizes = np.diff(starts)
    firsts = starts[:-1]
    taken = sketches.take(pa.array(rows)) if len(rows) else sketches.slice(0, 0)
    out_index = rows[firsts[sizes > 0]] if len(rows) else np.empty(0, np.int64)
    if len(firsts) and (sizes == 1).all():
        return sketches.take(pa.array(out_index))
    ds = _ds()
    bodies: list[bytes | None] = []
    index = np.zeros(len(firsts), dtype=np.int64)
    one = sizes == 1
    index[one] = rows[firsts[one]]
    base = len(sketches)
    for g in np.nonzero(~one)[0].tolist():
        members = taken.slice(int(starts[g]), int(sizes[g])).to_pylist()
        present = [m for m in members if m is not None]
        if not present:
            result = None
        elif len(present) == 1 or (kind != "quantiles" and all(m == present[0] for m in present)):
            result = present[0]
        elif kind == "hll":
            union = ds.hll_union(size)
            for m in present:
                union.update(ds.hll_sketch.deserialize(m))
            result = bytes(union.get_result(getattr(ds.tgt_hll_type, tgt)).serialize_compact())
        elif kind == "theta":
            union = ds.theta_union(size)
            for m in present:
                union.update(ds.compact_theta_sketch.deserialize(m))
            result = bytes(union.get_result().serialize())
        else:
            merged = ds.quantiles_doubles_sketch(size)
            for m in present:
                merged.merge(ds.quantiles_doubles_sketch.deserialize(m))
            result = bytes(merged.serialize())
        index[g] = base + len(bodies)
        bodies.append(result)
    return pa.concat_arrays([sketches.cast(pa.binary()), pa.array(bodies, pa.binary())]
                            ).take(pa.array(index))
