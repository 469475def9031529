"""Spark's ``try_cast(text AS TIMESTAMP)`` on Arrow, in the session time zone UTC.

The grammar is Spark's ``SparkDateTimeUtils.parseTimestampString``: after trimming
whitespace and control characters, ``[+-]yyyy[yy][-[m]m[-[d]d[( |T)[h]h[:[m]m[:[s]s[.fraction]
[zone]]]]]]``, or a time alone (``[h]h:[m]m[:[s]s...]`` or ``T...``: today's date); at
most 6 fraction digits count (more are truncated); the date and time must exist
(``LocalDate.of``/``LocalTime.of``); the zone is ``Z``, an offset (``+h``, ``+hh:mm``,
``+hhmm``, ``+hh:mm:ss``, up to 18 hours), ``UTC``/``GMT``/``UT`` with or without an offset,
or the fixed short ids ``EST``/``MST``/``HST``; without one the time is UTC.

The common shape (``yyyy-MM-ddTHH:mm:ss[.ffffff][Z|+hh:mm]``) goes through Arrow's cast;
anything else through one regular expression and numpy. A region zone (``Europe/Paris``,
``PST``) is not computed here: :class:`RegionZone` is raised, and the caller falls back to
the JVM reader (see :mod:`.native_text`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.phase1.spark_compat.casts import SPARK_TRIM

_FAST_ZONED = (r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?"
               r"(?:Z|[+-](?:0[0-9]|1[0-7]):[0-5][0-9]|[+-]18:00)$")
_FAST_LOCAL = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?)?$"
_FULL = (r"^(?P<sign>[+-]?)(?P<y>[0-9]{4,6})(?:-(?P<mo>[0-9]{1,2})(?:-(?P<d>[0-9]{1,2})"
         r"(?:[ T](?P<h>[0-9]{1,2})(?::(?P<mi>[0-9]{1,2})(?::(?P<s>[0-9]{1,2})"
         r"(?:\.(?P<f>[0-9]*))?(?P<z>[^0-9.].*)?)?)?)?)?)?$")
_TIME = (r"^(?P<t>T?)(?P<h>[0-9]{1,2})(?::(?P<mi>[0-9]{1,2})(?::(?P<s>[0-9]{1,2})"
         r"(?:\.(?P<f>[0-9]*))?(?P<z>[^0-9.].*)?)?)?$")
# ZoneOffset.of: +h, +hh, +hh:mm, +hhmm, +hh:mm:ss, +hhmmss
_OFFSET = (r"^(?P<sg>[+-])(?:(?P<h1>[0-9])|(?P<h>[0-9]{2})(?::(?P<m>[0-9]{2})"
           r"(?::(?P<s>[0-9]{2}))?|(?P<m2>[0-9]{2})(?P<s2>[0-9]{2})?)?)$")
_FIXED = {"Z": 0, "UTC": 0, "GMT": 0, "UT": 0, "EST": -5 * 3600, "MST": -7 * 3600,
          "HST": -10 * 3600}
_MICROS = 1_000_000
_DAY = 86_400


class RegionZone(ValueError):
    """A timestamp names a region time zone (its offset depends on the date): not
    computed natively."""


def to_micros(text: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``try_cast(text AS TIMESTAMP)`` as epoch microseconds (int64, null if unparseable)."""
    s = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    s = s if s.type == pa.string() else s.cast(pa.string())
    quick = _all_canonical(s)
    if quick is not None:
        return quick
    out = pa.nulls(len(s), pa.int64())
    todo = pc.is_valid(s)
    for pattern, typ in ((_FAST_ZONED, pa.timestamp("us", tz="UTC")),
                         (_FAST_LOCAL, pa.timestamp("us"))):
        hit = pc.and_(todo, pc.fill_null(pc.match_substring_regex(s, pattern), False))
        if not pc.any(hit).as_py():
            continue
        try:  # Arrow refuses a day or time that does not exist: then the slow path decides
            cast = pc.cast(pc.if_else(hit, s, pa.scalar(None, pa.string())), typ).cast(pa.int64())
        except pa.ArrowInvalid:
            continue
        out = pc.coalesce(out, cast)
        todo = pc.and_(todo, pc.invert(hit))
    if pc.any(todo).as_py():
        idx = np.flatnonzero(todo.to_numpy(zero_copy_only=False))
        slow = _parse(pc.utf8_trim(s.take(pa.array(idx)), SPARK_TRIM),
                      pc.starts_with(s.take(pa.array(idx)), "T"))
        filled = np.zeros(len(s), dtype=np.int64)
        mask = np.ones(len(s), dtype=bool)
        filled[idx] = slow.fill_null(0).to_numpy()
        mask[idx] = ~pc.is_valid(slow).to_numpy(zero_copy_only=False)
        out = pc.coalesce(out, pa.array(filled, pa.int64(), mask=mask))
    return out


def _all_canonical(s: pa.Array) -> pa.Array | None:
    """The common case at a fraction of the cost: every value ``yyyy-MM-dd(T| )HH:mm:ss
    [.f]Z``. Arrow's cast parses them exactly as Spark does; it also takes forms Spark
    refuses (a zone after the hour or minute, a lowercase 't'), which the fixed positions
    of 'T' and ':' rule out. None: not all values are such (the caller checks each)."""
    if s.null_count or not len(s):
        return None
    try:
        cast = pc.cast(s, pa.timestamp("us", tz="UTC"))
    except pa.ArrowInvalid:
        return None
    raw = s.cast(pa.binary())  # byte positions: ASCII digits and separators
    sep = pc.binary_slice(raw, 10, 11)
    shape = pc.and_(pc.and_(pc.equal(pc.binary_slice(raw, 16, 17), b":"),
                            pc.or_(pc.equal(sep, b"T"), pc.equal(sep, b" "))),
                    pc.ends_with(s, "Z"))
    if not pc.all(shape).as_py():
        return None
    return cast.cast(pa.int64())


def _ints(parts: pa.StructArray, name: str, default: int) -> np.ndarray:
    col = parts.field(name)
    empty = pc.equal(pc.utf8_length(col), 0)
    col = pc.if_else(pc.fill_null(empty, True), pa.scalar(str(default)), col)
    return col.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _parse(s: pa.Array, leading_t: pa.Array) -> pa.Array:
    """The slow path: every form of the grammar, one row at a time only in numpy."""
    n = len(s)
    dated = pc.fill_null(pc.match_substring_regex(s, _FULL), False)
    # A time alone: 'T' only counts at the very start (before trimming), as in Spark.
    timed = pc.and_(pc.invert(dated), pc.fill_null(pc.match_substring_regex(s, _TIME), False))
    timed = pc.and_(timed, pc.or_(pc.invert(pc.starts_with(s, "T")), leading_t))
    # Without the 'T', a time alone needs its ':' ("10" is a two-digit year: invalid).
    timed = pc.and_(timed, pc.or_(leading_t, pc.match_substring(s, ":")))
    ok = pc.or_(dated, timed).to_numpy(zero_copy_only=False)
    if not ok.any():
        return pa.nulls(n, pa.int64())
    d = pc.extract_regex(pc.if_else(dated, s, pa.scalar("0000")), _FULL)
    t = pc.extract_regex(pc.if_else(timed, s, pa.scalar("0:0")), _TIME)
    is_t = timed.to_numpy(zero_copy_only=False)
    zone, zone_ok = _zones(pc.if_else(timed, t.field("z"), d.field("z")))
    ok &= zone_ok
    if is_t.any():  # a time alone is on today's date in its own zone (LocalDate.now(zone))
        now = np.datetime64("now", "s").astype(np.int64)
        ymd = _civil_from_days(np.floor_divide(now + zone, _DAY))
    else:
        ymd = (np.zeros(n, np.int64),) * 3
    sign = np.where(pc.equal(d.field("sign"), "-").to_numpy(zero_copy_only=False), -1, 1)
    year = np.where(is_t, ymd[0], sign * _ints(d, "y", 0))
    month = np.where(is_t, ymd[1], _ints(d, "mo", 1))
    day = np.where(is_t, ymd[2], _ints(d, "d", 1))
    pick = {k: np.where(is_t, _ints(t, k, 0), _ints(d, k, 0)) for k in ("h", "mi", "s")}
    frac_text = pc.fill_null(pc.if_else(timed, t.field("f"), d.field("f")), "")
    frac6 = pc.utf8_slice_codeunits(pc.binary_join_element_wise(frac_text, "000000", ""), 0, 6)
    frac = frac6.cast(pa.int64()).to_numpy(zero_copy_only=False)
    ok &= (month >= 1) & (month <= 12) & (pick["h"] <= 23) & (pick["mi"] <= 59) & (pick["s"] <= 59)
    ok &= (day >= 1) & (day <= days_in_month(year, np.clip(month, 1, 12)))
    days = days_from_civil(year, np.clip(month, 1, 12), day)
    seconds = days * _DAY + pick["h"] * 3600 + pick["mi"] * 60 + pick["s"] - zone
    # instantToMicros: exactly the instants whose microseconds fit in an int64
    lo, lo_us = divmod(-(2 ** 63), _MICROS)
    hi, hi_us = divmod(2 ** 63 - 1, _MICROS)
    ok &= (((seconds > lo) | ((seconds == lo) & (frac >= lo_us)))
           & ((seconds < hi) | ((seconds == hi) & (frac <= hi_us))))
    with np.errstate(over="ignore"):  # in range, the wrapped int64 arithmetic is exact
        micros = np.where(ok, seconds, 0) * _MICROS + np.where(ok, frac, 0)
    return pa.array(micros, pa.int64(), mask=~ok)


def _zones(z: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offset seconds of each zone text (empty: UTC) and whether it is a valid zone."""
    n = len(z)
    text = pc.utf8_trim(pc.fill_null(z, ""), "".join(chr(c) for c in range(0x21)))
    # Spark pads '+h:' and a one-digit minute at the end before ZoneId.of.
    text = pc.replace_substring_regex(text, r"([+-])([0-9]):", r"\10\2:", max_replacements=1)
    text = pc.replace_substring_regex(text, r"([+-][0-9][0-9]):([0-9])$", r"\1:0\2")
    values = text.to_numpy(zero_copy_only=False)
    offset = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    empty = values == ""
    valid |= empty
    for name, secs in _FIXED.items():
        hit = values == name
        offset[hit], valid[hit] = secs, True
    # An offset alone, or after a UTC/GMT/UT prefix.
    bare = pc.replace_substring_regex(text, r"^(?:UTC|GMT|UT)([+-])", r"\1")
    parts = pc.extract_regex(bare, _OFFSET)
    hit = pc.is_valid(parts).to_numpy(zero_copy_only=False)
    if hit.any():
        h, m, s = (_ints(parts, a, 0) + _ints(parts, b, 0)
                   for a, b in (("h", "h1"), ("m", "m2"), ("s", "s2")))
        sg = np.where(pc.equal(parts.field("sg"), "-").to_numpy(zero_copy_only=False), -1, 1)
        total = h * 3600 + m * 60 + s
        good = hit & (m <= 59) & (s <= 59) & (total <= 18 * 3600) & (h <= 18)
        offset = np.where(good, sg * total, offset)
        valid |= good
    unknown = ~valid & ~empty
    if unknown.any():
        _check_regions(set(values[unknown].tolist()))
    return offset, valid


def _check_regions(names: set[str]) -> None:
    """Raise :class:`RegionZone` if one of ``names`` is a zone Java knows (tzdata);
    the others are not zones at all (Spark gives null)."""
    from zoneinfo import available_timezones

    known = available_timezones() | {"PST", "CST", "AST", "IST", "CTT", "JST", "ECT", "CAT",
                                     "EAT", "NET", "PLT", "BET", "AET", "ACT", "AGT", "ART",
                                     "BST", "NST", "PNT", "PRT", "SST", "VST", "MIT", "CNT",
                                     "IET"}
    found = sorted(n for n in names if n in known)
    if found:
        raise RegionZone(f"a timestamp with the region time zone {found[0]!r}")


def days_in_month(year: np.ndarray, month: np.ndarray) -> np.ndarray:
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[month - 1]
    return days + ((month == 2) & leap)


def days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    y = y - (m <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    doy = (153 * (m + np.where(m > 2, -3, 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(year, month, day) of days since 1970-01-01 (the inverse of :func:`days_from_civil`)."""
    z = z + 719468
    era = np.floor_divide(z, 146097)
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + np.where(mp < 10, 3, -9)
    return yoe + era * 400 + (m <= 2), m, d
