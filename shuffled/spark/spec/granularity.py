"""Druid granularities over UTC epoch milliseconds, in Python and as Spark SQL expressions.

Fixed-length granularities (second ... day) are epoch-aligned in UTC; ``week`` starts on
Monday (ISO, as Druid); ``month``/``quarter``/``year`` follow the calendar in UTC. The Spark
expressions compute exactly what :func:`truncate` computes, in the JVM, so the Python side
never has to look at every row to bucket it; :func:`truncate_array` computes it on numpy
arrays for the native readers.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WEEK = 7 * DAY
MONDAY_OFFSET = 4 * DAY  # 1970-01-05 was a Monday

#: Fixed periods in milliseconds; calendar granularities map to months.
FIXED: dict[str, int] = {
    "second": SECOND,
    "minute": MINUTE,
    "fifteen_minute": 15 * MINUTE,
    "thirty_minute": 30 * MINUTE,
    "hour": HOUR,
    "six_hour": 6 * HOUR,
    "day": DAY,
    "week": WEEK,
}
MONTHS: dict[str, int] = {"month": 1, "quarter": 3, "year": 12}
GRANULARITIES: tuple[str, ...] = ("none", *FIXED, *MONTHS)


def _to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms // 1000, tz=timezone.utc)


def _month_start(year: int, month0: int) -> int:
    """Epoch millis of the first instant of month ``month0`` (0-based, may overflow a year)."""
    y, m = year + month0 // 12, month0 % 12
    return int(datetime(y, m + 1, 1, tzinfo=timezone.utc).timestamp()) * 1000


def truncate(ms: int, granularity: str) -> int:
    """The start of the ``granularity`` bucket holding ``ms``."""
    if granularity == "none":
        return ms
    if granularity == "week":
        return ms - (ms - MONDAY_OFFSET) % WEEK
    if granularity in FIXED:
        return ms - ms % FIXED[granularity]
    step = MONTHS[granularity]
    dt = _to_dt(ms)
    month0 = (dt.month - 1) // step * step
    return _month_start(dt.year, month0)


def bucket_end(start: int, granularity: str) -> int:
    """The end of the bucket that starts at ``start`` (which must be a bucket start)."""
    if granularity == "none":
        return start + 1
    if granularity in FIXED:
        return start + FIXED[granularity]
    dt = _to_dt(start)
    return _month_start(dt.year, dt.month - 1 + MONTHS[granularity])


def buckets(start: int, end: int, granularity: str) -> list[int]:
    """Starts of every bucket overlapping [start, end)."""
    out = []
    cur = truncate(start, granularity)
    while cur < end:
        out.append(cur)
        cur = bucket_end(cur, granularity)
    return out


def spark_truncate(col: str, granularity: str) -> str:
    """A Spark SQL expression truncating the BIGINT epoch-millis column ``col``.

    Calendar granularities go through ``date_trunc`` and need the session time zone UTC
    (the pipeline sets it for the duration of a job).
    """
    if granularity == "none":
        return col
    if granularity == "week":
        return f"({col} - pmod({col} - {MONDAY_OFFSET}L, {WEEK}L))"
    if granularity in FIXED:
        period = FIXED[granularity]
        return f"({col} - pmod({col}, {period}L))"
    unit = granularity.upper()
    return f"unix_millis(date_trunc('{unit}', timestamp_millis({col})))"


def truncate_array(ms: np.ndarray, granularity: str) -> np.ndarray:
    """:func:`shuffled.spark.spec.granularity.truncate` of every element (int64 epoch millis)."""
    if granularity == "none":
        return ms
    if granularity == "week":
        return ms - np.mod(ms - MONDAY_OFFSET, WEEK)
    if granularity in FIXED:
        return ms - np.mod(ms, FIXED[granularity])
    months = ms.astype("datetime64[ms]").astype("datetime64[M]").astype(np.int64)
    months -= np.mod(months, MONTHS[granularity])
    return months.astype("datetime64[M]").astype("datetime64[ms]").astype(np.int64)
