"""First/last aggregators (Druid's ``longFirst`` ... ``stringLast``) over any group-by.

A first (last) aggregate is the value of the row with the smallest (largest) time. Each row
is given its dense rank in (time, value) order, and the group-by (Acero's or
:mod:`.grouping`'s) takes the ``min`` (first) or ``max`` (last) rank per group, which it does
for any key type; the rank is then turned back into that row's value and time. The time
travels beside the value in a hidden column (:func:`hidden_time`) through partials and phase
2's combine, which picks the same way, and is dropped from the segment.

Order and ties: values order nulls first, then ascending (Arrow's ``rank``: strings by UTF-8
bytes, NaN last). Druid keeps the first row it *sees* on a tie for first (``time <
firstTime``) and the last seen for last (``time >= lastTime``), which depends on how the
input was split and merged; here a tie is broken by the value, so the result is the same
however rows are split: first takes the smallest (time, value), last the largest. A null
value is kept (Druid's SQL-compatible mode: a first row with a null value gives null); a row
with a null time is never picked unless every row of its group has one (then null).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FIRST_LAST = ("first", "last")
_PREFIX = "__time:"
_VALUE_ORDER = pc.RankOptions(sort_keys=[("", "ascending", "at_start")], tiebreaker="dense")


def hidden_time(metric: str) -> str:
    """The hidden column carrying a first/last metric's time through partials."""
    return _PREFIX + metric


def _plain(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    return arr


class Picker:
    """One first/last metric over one table: each row's rank (to aggregate with ``how``)
    and, after the group-by, the picked rows' value and time."""

    def __init__(self, times: pa.Array | pa.ChunkedArray, values: pa.Array | pa.ChunkedArray,
                 last: bool) -> None:
        self.times = _plain(times).cast(pa.int64())
        self.values = _plain(values)
        self.how = "max" if last else "min"
        n = len(self.times)
        valid = pc.is_valid(self.times).to_numpy(zero_copy_only=False)
        # A null time sorts after every time for first, before for last: never picked
        # while its group has a time.
        absent = (valid if last else ~valid).astype(np.int8)
        t = self.times.fill_null(0).to_numpy(zero_copy_only=False)
        v = pc.rank(self.values, options=_VALUE_ORDER).to_numpy(zero_copy_only=False)
        order = np.lexsort((v, t, absent))
        change = np.ones(n, dtype=bool)
        if n:
            s_abs, s_t, s_v = absent[order], t[order], v[order]
            change[1:] = (s_abs[1:] != s_abs[:-1]) | (s_t[1:] != s_t[:-1]) | (s_v[1:] != s_v[:-1])
        dense = np.cumsum(change) - 1
        self.ranks = np.empty(n, dtype=np.int64)
        self.ranks[order] = dense
        self.rows = order[change]  # a row of each rank

    def rank_column(self) -> pa.Array:
        return pa.array(self.ranks, pa.int64())

    def resolve(self, picked: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
        """The value and time of the rows whose ranks the group-by picked."""
        ranks = _plain(picked).to_numpy(zero_copy_only=False)
        idx = pa.array(self.rows[ranks]) if len(ranks) else pa.array([], pa.int64())
        times = self.times.take(idx)
        values = self.values.take(idx)
        if times.null_count:
            values = pc.if_else(pc.is_valid(times), values, pa.scalar(None, values.type))
        return values, times
