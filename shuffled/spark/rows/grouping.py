"""Sort-based group-by of Arrow tables in numpy (the phase-1 rollup and the merge).

Each key column becomes small integer codes: an integer column ``(v - min) / gcd`` (or its
rank when that range is wider than the column is long), a string column its dictionary
indices (dictionary-encoded first if it is plain). The codes of all key columns are mixed
into ONE int64 per row (mixed radix, first column most significant; a prefix whose range
would overflow is replaced by its rank), the rows are stably sorted by it, and each run of
equal values is a group. Grouping string keys by their dictionary indices is several times
faster than Acero's hash group-by on the strings, and the result comes out sorted by the
first key (the time chunk), which the split into partial segments needs anyway.

Aggregates follow Arrow's hash aggregates exactly: ``count_all``; ``sum`` skipping nulls,
null for a group without values, integers summed in int64 (wrapping), floating point
accumulated in float64 in input row order; ``min``/``max`` skipping nulls and NaN (NaN
only when every value is NaN). Key types other than integers and strings are refused
(:func:`group` returns None): the caller uses Acero then.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_LIMIT = 1 << 62  # the mixed-radix key stays below this (int64, no overflow)


@dataclass(frozen=True)
class Groups:
    """Rows grouped: ``order`` sorts the rows by key, groups start at ``starts`` in that
    order; ``first`` is each group's first row (input order, when grouped stably), ``gid``
    each row's group."""

    order: np.ndarray
    starts: np.ndarray
    first: np.ndarray
    count: int
    rows: int

    def gid(self) -> np.ndarray:
        """The group number of every input row."""
        change = np.zeros(self.rows, dtype=np.int64)
        change[self.starts[1:]] = 1
        out = np.empty(self.rows, dtype=np.int64)
        out[self.order] = np.cumsum(change)
        return out

    def sizes(self) -> np.ndarray:
        """Rows per group."""
        return np.diff(np.append(self.starts, self.rows)).astype(np.int64)


def _int_codes(col: pa.Array) -> tuple[np.ndarray, int]:
    """Order-preserving codes of an integer column (nulls are code 0) and their range."""
    n = len(col)
    valid = None if col.null_count == 0 else pc.is_valid(col).to_numpy(zero_copy_only=False)
    if n == 0 or (valid is not None and not valid.any()):
        return np.zeros(n, dtype=np.int64), 1
    values = col.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    present = values if valid is None else values[valid]
    lo, hi = int(present.min()), int(present.max())
    shift = 0 if valid is None else 1
    if hi - lo < (1 << 62):
        delta = values - np.int64(lo)
        if valid is not None:
            delta[~valid] = 0
        step = int(np.gcd.reduce(delta)) or 1
        if (hi - lo) // step < n:
            if step > 1:
                delta //= step
            if valid is not None:
                delta += 1
                delta[~valid] = 0
            return delta, (hi - lo) // step + 1 + shift
    uniq, codes = np.unique(present, return_inverse=True)
    if valid is None:
        return codes.astype(np.int64, copy=False), len(uniq)
    out = np.zeros(n, dtype=np.int64)
    out[valid] = codes + 1
    return out, len(uniq) + 1


def clean(arr: pa.DictionaryArray) -> pa.DictionaryArray:
    """``arr`` with index 0 under its null slots. Arrow leaves those bytes undefined (Acero
    and ``take`` leave whatever the allocator had), and pyarrow's dictionary unification
    (``combine_chunks``, ``unify_dictionaries``) transposes them anyway: an index far out
    of range there crashes the process."""
    idx = arr.indices
    if idx.null_count == 0:
        return arr
    bitmap = pc.is_valid(idx).buffers()[1]  # a fresh boolean array: offset 0, bit-packed
    zeroed = idx.fill_null(0)
    indices = pa.Array.from_buffers(idx.type, len(idx), [bitmap, zeroed.buffers()[1]],
                                    idx.null_count, zeroed.offset)
    return pa.DictionaryArray.from_arrays(indices, arr.dictionary)


def dictionary_of(col: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
    """``col`` (string or dictionary of strings) as ONE dictionary array whose dictionary
    holds each value once and no null (equal indices <=> equal values)."""
    if isinstance(col, pa.ChunkedArray):
        if pa.types.is_dictionary(col.type):
            col = pa.chunked_array([clean(c) for c in col.chunks], col.type)
        arr = col.combine_chunks()
    else:
        arr = col
    if pa.types.is_dictionary(arr.type):
        arr = clean(arr)
        d = arr.dictionary
        if d.null_count == 0 and pc.count_distinct(d, mode="all").as_py() == len(d):
            return arr
        arr = arr.cast(arr.type.value_type)
    return pc.dictionary_encode(arr)


def _dict_codes(arr: pa.DictionaryArray) -> tuple[np.ndarray, int]:
    """Dictionary indices as codes (a null is one past the dictionary) and their range."""
    card = len(arr.dictionary)
    idx = arr.indices
    if idx.null_count:
        idx = idx.fill_null(card)
        card += 1
    return idx.to_numpy(zero_copy_only=False).astype(np.int64), max(card, 1)


def sort_order(table: pa.Table, keys: list[str]) -> np.ndarray | None:
    """The stable order sorting ``table`` by ``keys`` ascending, nulls first, as Arrow's
    ``sort_by`` gives it; None if a key is neither integer nor string. Each key becomes
    order-preserving integer codes (a string column its dictionary's ranks: the bytes
    compared as Arrow compares them), mixed into one int64 sorted by numpy: Arrow's
    multi-column sort compares strings row by row (200 ms for a 590,000-row shard of
    comparison 5, against ~60 here)."""
    n = table.num_rows
    parts: list[tuple[np.ndarray, int]] = []
    for k in keys:
        col = table.column(k)
        t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            # Each value once, no null in the dictionary; a null is rank 0: first.
            parts.append(_value_codes(dictionary_of(col)))
        elif pa.types.is_integer(col.type):
            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            parts.append(_int_codes(arr))
        else:
            return None
    return np.argsort(_mix(parts, n), kind="stable")


def _mix(parts: list[tuple[np.ndarray, int]], n: int) -> np.ndarray:
    key = np.zeros(n, dtype=np.int64)
    total = 1
    for codes, card in parts:
        if total * card >= _LIMIT:  # rank the prefix so far: same order, dense
            uniq, key = np.unique(key, return_inverse=True)
            key = key.astype(np.int64, copy=False)
            total = len(uniq)
        if total > 1:
            key *= card
        key += codes
        total *= card
    return key


def key_columns(table: pa.Table, keys: list[str]) -> list[pa.Array] | None:
    """The key columns as single arrays (strings as :func:`dictionary_of`); None if a key
    is neither integer nor string."""
    out: list[pa.Array] = []
    for k in keys:
        col = table.column(k)
        t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            out.append(dictionary_of(col))
        elif pa.types.is_integer(col.type):
            out.append(col.combine_chunks())
        else:
            return None
    return out


def _order(key: np.ndarray, stable: bool) -> np.ndarray:
    """The order sorting ``key``: stable (timsort: fastest on keys already mostly in
    order, as time-ordered input gives), or else, for keys far from sorted, introsort
    (twice as fast as timsort on 1M random keys, measured)."""
    if not stable and len(key) > 4096:
        sample = key[::64]  # far from sorted when a quarter of a strided sample descends
        if 4 * int(np.count_nonzero(sample[1:] < sample[:-1])) > len(sample):
            return np.argsort(key)
    return np.argsort(key, kind="stable")


def _value_codes(arr: pa.Array) -> tuple[np.ndarray, int]:
    """Codes of ``arr`` (from :func:`key_columns`) in its values' order, nulls first (code
    0): a dictionary column's codes are its dictionary's ranks, as :func:`sort_order`'s."""
    if not pa.types.is_dictionary(arr.type):
        return _int_codes(arr)
    ranks = np.concatenate([[0], pc.rank(arr.dictionary).to_numpy()]).astype(np.int64)
    at = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return ranks[at + 1], len(ranks)


def group(columns: list[pa.Array], n: int, relative: dict[int, int] | None = None,
          stable: bool = True, lead: np.ndarray | None = None,
          ordered: tuple[int, ...] = ()) -> Groups:
    """Group ``n`` rows by ``columns`` (from :func:`key_columns`).

    ``relative`` maps a column index to an earlier one: that column is coded by its
    difference to the earlier column (the same groups, since the earlier one is a key
    too; ``__time - __chunk`` spans one chunk where ``__time`` spans the whole input).
    Without ``stable`` the rows of a group may come in any order (and ``first`` is some
    row of it): what every aggregate but ``list`` allows.

    ``lead`` (non-negative integers, a function of the key: equal keys, equal leads) sorts
    the groups right after the first column, so that they come out in the order a
    consumer needs (a slab's (chunk, partition, hash),
    :func:`shuffled.spark.phase1.slabs.with_lead`) from the sort grouping does anyway:
    mixed into the key where it has room; where the key overflows without it, the rows
    are sorted by (first column, lead) alone (:func:`_by_lead`); else it is left out, the
    groups the same.

    ``ordered`` (indices of columns after the first) sorts the groups by those columns'
    values, nulls first, right after the first column: a range-keyed slab's (chunk,
    partition dimensions) order (:func:`shuffled.spark.phase1.slabs.row_keys`), from the
    same sort.
    """
    parts: list[tuple[np.ndarray, int]] = []
    for i, arr in enumerate(columns):
        if i in ordered:
            parts.append(_value_codes(arr))
            continue
        if pa.types.is_dictionary(arr.type):
            parts.append(_dict_codes(arr))
            continue
        j = (relative or {}).get(i)
        if j is not None and arr.null_count == 0 and columns[j].null_count == 0:
            arr = pc.subtract_checked(arr.cast(pa.int64()), columns[j].cast(pa.int64()))
        parts.append(_int_codes(arr))
    if ordered:
        parts = [parts[0], *(parts[i] for i in ordered),
                 *(p for i, p in enumerate(parts[1:], 1) if i not in ordered)]
    if lead is not None and n and parts:
        span = 1
        for _, card in parts:
            span *= card
        top = int(lead.max()) + 1
        if span * top < _LIMIT:
            parts.insert(1, (lead.astype(np.int64, copy=False), top))
        elif span >= _LIMIT and parts[0][1] * (1 << top.bit_length()) < _LIMIT:
            order, starts = _by_lead(parts, lead, top, stable)
            return Groups(order, starts, order[starts], len(starts), n)
    key = _mix(parts, n)
    if n and bool(np.all(key[1:] >= key[:-1])):
        order = np.arange(n, dtype=np.int64)
        ks = key
    else:
        order = _order(key, stable)
        ks = key[order]
    starts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
    starts = np.concatenate([np.zeros(min(n, 1), dtype=np.int64), starts])
    return Groups(order, starts, order[starts], len(starts), n)


def _by_lead(parts: list[tuple[np.ndarray, int]], lead: np.ndarray, top: int,
             stable: bool) -> tuple[np.ndarray, np.ndarray]:
    """(order, group starts) of rows sorted by (first column's codes, ``lead``, whose
    values are below ``top``), then, in the rare run of one lead that holds several keys
    (a hash collision), by the other columns' codes. A key of many columns overflows the
    mixed int64, which :func:`_mix` then ranks by a sort of its own; this is one sort of
    one int64 whatever the columns, and a comparison of each column only where a row's
    lead equals the one before it."""
    first = parts[0][0]
    width = np.uint64(top.bit_length())
    packed = (first.astype(np.uint64) << width) | lead.astype(np.uint64)
    order = _order(packed, stable)
    ks = packed[order]
    same = ks[1:] == ks[:-1]
    rest = [codes for codes, _ in parts[1:]]

    def differ() -> np.ndarray:
        at = np.flatnonzero(same)
        out = np.zeros(len(same), dtype=bool)
        for codes in rest:
            out[at] |= codes[order[at + 1]] != codes[order[at]]
        return out

    split = differ()
    if split.any():
        run = np.concatenate([[0], np.cumsum(~same)])  # each sorted row's run of one lead
        mixed = np.zeros(int(run[-1]) + 1, dtype=bool)
        mixed[run[1:][split]] = True
        at = np.flatnonzero(mixed[run])  # the rows of those runs (each run contiguous)
        sub = order[at]
        # lexsort is stable: equal keys keep the order the first sort gave them.
        order[at] = sub[np.lexsort([codes[sub] for codes in reversed(rest)] + [run[at]])]
        split = differ()
    starts = np.flatnonzero(~same | split) + 1
    return order, np.concatenate([np.zeros(min(len(order), 1), dtype=np.int64), starts])


def aggregate(col: pa.Array | pa.ChunkedArray | None, how: str, g: Groups) -> pa.Array:
    """``how`` (count_all, sum, min, max, list) of ``col`` per group, as Arrow would
    (``list``: each group's values, in row order)."""
    if how == "count_all":
        return pa.array(g.sizes(), pa.int64())
    assert col is not None
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if how == "list":
        offsets = pa.array(np.append(g.starts, g.rows), pa.int32())
        return pa.ListArray.from_arrays(offsets, arr.take(pa.array(g.order)))
    floating = pa.types.is_floating(arr.type)
    if how == "sum":
        arr = arr.cast(pa.float64() if floating else pa.int64())
    elif not floating and not pa.types.is_integer(arr.type):
        raise TypeError(f"no {how} aggregate for Arrow type {arr.type}")
    valid = None if arr.null_count == 0 else pc.is_valid(arr).to_numpy(zero_copy_only=False)
    if how == "sum" and floating:
        # bincount accumulates in input row order, in float64: Arrow's grouped sum exactly.
        values = arr.fill_null(0.0).to_numpy(zero_copy_only=False)
        out = np.bincount(g.gid(), weights=values, minlength=g.count)
    else:
        if how == "sum":
            fill: float | int = 0
        elif floating:
            fill = np.nan
        else:
            info = np.iinfo(np.dtype(arr.type.to_pandas_dtype()))
            fill = info.max if how == "min" else info.min
        values = arr.fill_null(fill).to_numpy(zero_copy_only=False)[g.order]
        ufunc = {"sum": np.add, "min": np.fmin if floating else np.minimum,
                 "max": np.fmax if floating else np.maximum}[how]
        out = ufunc.reduceat(values, g.starts) if g.count else values[:0]
    mask = None
    if valid is not None:
        present: np.ndarray | list[int] = (
            np.add.reduceat(valid[g.order].astype(np.int64), g.starts) if g.count else [])
        mask = np.asarray(present) == 0
    typ = arr.type if how != "sum" else (pa.float64() if floating else pa.int64())
    return pa.array(out, typ, mask=mask)


def take_keys(columns: list[pa.Array], g: Groups) -> list[pa.Array]:
    """Each key column's value for every group (dictionary columns stay dictionaries)."""
    idx = pa.array(g.first)
    return [clean(c.take(idx)) if pa.types.is_dictionary(c.type) else c.take(idx)
            for c in columns]
