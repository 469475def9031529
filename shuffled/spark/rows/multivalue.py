"""Multi-value string dimensions as one string per row while rows are rolled up and shuffled.

A row's multi-value (a JSON array, after ``multiValueHandling``) travels through phase 1,
the shuffle and phase 2's merge as ONE string, so grouping, hashing, range splitting and
sorting treat it as any string key and compare the whole array:

- no element (``[]``) is null and one element is that element (Druid stores both so);
- two or more elements are joined by :data:`SEP` (U+0000), each element as :data:`ITEM`
  (U+0001) followed by its value, a null element as nothing.

Values may not contain U+0000 (phase 1 refuses such rows), so the encoding is injective
and a string is multi-value exactly when it contains :data:`SEP`. It orders arrays element
by element, nulls first, a prefix before a longer array (U+0000 sorts below any element).
Phase 2 turns the dimension back into ``list<string>`` for the segment (:func:`decode`):
one value ``v`` is ``[v]``, null stays null.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEP = "\x00"
ITEM = "\x01"
LIST_TYPE = pa.list_(pa.string())


def encode(values: list[str | None] | None) -> str | None:
    """The one-string form of an (already handled) array (pure Python: tests, reference)."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return SEP.join("" if v is None else ITEM + v for v in values)


def has_multi(col: pa.Array | pa.ChunkedArray) -> bool:
    """Whether any value of a string (or dictionary of strings) column is multi-value."""
    if isinstance(col, pa.ChunkedArray):
        return any(has_multi(c) for c in col.chunks)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary
    if len(col) == 0:
        return False
    return bool(pc.any(pc.match_substring(col, SEP)).as_py())


def decode(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A string column in the one-string form as ``list<string>`` (see the module doc)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    col = col.cast(pa.string())
    multi = pc.fill_null(pc.match_substring(col, SEP), False).to_numpy(zero_copy_only=False)
    # Single values: split on nothing, each its own one-element list (null stays null).
    parts = pc.split_pattern(col, SEP)
    if not multi.any():
        return parts
    flat = pc.list_flatten(parts)
    offsets = parts.offsets.to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    in_multi = np.repeat(multi, lengths)
    # Elements of multi-value rows: "" is a null element, otherwise ITEM + value.
    empty = pc.equal(flat, "").to_numpy(zero_copy_only=False)
    stripped = pc.utf8_slice_codeunits(flat, 1)
    values = pc.if_else(pa.array(in_multi), stripped, flat)
    values = pc.if_else(pa.array(in_multi & empty), pa.scalar(None, pa.string()), values)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values,
                                    mask=pc.is_null(col))
