"""The functions of :data:`shuffled.spark.spec.expr.FUNCTIONS` on Arrow, one ``fn_<name>``
each, computing what the Spark translation (:class:`.transform.Translator`) computes. ``t``
is the :class:`shuffled.spark.phase1.arrow_expr.transform.ArrowTranslator` evaluating the arguments.

Arguments Arrow needs as constants (substring's index and length, replace's strings,
patterns) must be literals here; :func:`shuffled.spark.phase1.arrow_expr.transform.unsupported` says so before a task
runs, and the spec goes through the JVM reader.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.phase1.arrow_expr.values import (BOOL, DOUBLE, LONG, STRING, AVal, as_bool,
                                                   as_double, as_long, as_string, binary,
                                                   common, masked)
from shuffled.spark.phase1.arrow_expr.regex import java_regex, named_groups
from shuffled.spark.phase1.spark_compat.timestamps import to_micros
from shuffled.spark.spec.expr import Call, Lit
from shuffled.spark.spec.granularity import MONDAY_OFFSET, WEEK
from shuffled.spark.spec.patterns import like_to_regex, parse_period, period_millis

_ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
#: Pattern letters timestamp_parse/timestamp_format compute natively, and their widths.
PATTERN_FIELDS = {"yyyy": 4, "MM": 2, "dd": 2, "HH": 2, "mm": 2, "ss": 2, "SSS": 3}
_PATTERN = re.compile(r"(yyyy|MM|dd|HH|mm|ss|SSS)(?![A-Za-z])|'([^']*)'|([^A-Za-z'])")


def _lits(n: Call) -> list[Any]:
    return [a.value if isinstance(a, Lit) else None for a in n.args]


def pattern_parts(pattern: str) -> list[tuple[bool, str]] | None:
    """The pattern as (is a letter field, text) parts, or None if a letter is not one of
    :data:`PATTERN_FIELDS` (or repeats)."""
    parts, pos = [], 0
    while pos < len(pattern):
        m = _PATTERN.match(pattern, pos)
        if m is None:
            return None
        letter, quoted, other = m.groups()
        parts.append((True, letter) if letter else (False, quoted if quoted is not None else other))
        pos = m.end()
    letters = [p for is_field, p in parts if is_field]
    return parts if len(set(letters)) == len(letters) else None


def fn_concat(t: Any, n: Call) -> AVal:
    out = None
    for a in n.args:
        s = as_string(t(a))
        out = s if out is None else pc.binary_join_element_wise(out, s, "", null_handling="emit_null")
    return AVal(out, STRING)


def _const(t: Any, node: Any) -> int | None:
    """A literal argument as Druid's asLong (substring's index and length)."""
    v = as_long(t(node))
    return v[0].as_py() if len(v) else None


def fn_substring(t: Any, n: Call) -> AVal:
    s = as_string(t(n.args[0]))
    idx, length = _const(t, n.args[1]), _const(t, n.args[2])
    if idx is None or idx < 0:
        return AVal(pa.nulls(t.n, pa.string()), STRING)
    # Spark: substr(idx + 1, length if length >= 0 else the whole size), null from idx = size
    stop = idx + length if length is not None and length >= 0 else None
    out = pc.utf8_slice_codeunits(s, idx, stop) if stop is not None else pc.utf8_slice_codeunits(s, idx)
    return AVal(pc.if_else(pc.less(pa.scalar(idx, pa.int32()), pc.utf8_length(s)), out,
                           pa.scalar(None, pa.string())), STRING)


def fn_lower(t: Any, n: Call) -> AVal:
    return AVal(pc.utf8_lower(as_string(t(n.args[0]))), STRING)


def fn_upper(t: Any, n: Call) -> AVal:
    return AVal(pc.utf8_upper(as_string(t(n.args[0]))), STRING)


def fn_strlen(t: Any, n: Call) -> AVal:
    return AVal(pc.utf8_length(as_string(t(n.args[0]))).cast(pa.int64()), LONG)


def fn_trim(t: Any, n: Call) -> AVal:
    return AVal(pc.utf8_trim(as_string(t(n.args[0])), " "), STRING)


def fn_replace(t: Any, n: Call) -> AVal:
    s = as_string(t(n.args[0]))
    old, new = _lits(n)[1], _lits(n)[2]
    if old is None or new is None:
        return AVal(pa.nulls(t.n, pa.string()), STRING)
    if str(old) == "":  # Spark leaves the text as it is (and Arrow would never end)
        return AVal(s, STRING)
    return AVal(pc.replace_substring(s, str(old), str(new)), STRING)


def fn_nvl(t: Any, n: Call) -> AVal:
    kind, cols = common([t(a) for a in n.args])
    return AVal(pc.coalesce(*cols), kind)


def fn_isnull(t: Any, n: Call) -> AVal:
    return AVal(pc.is_null(t(n.args[0]).arr), BOOL)


def fn_notnull(t: Any, n: Call) -> AVal:
    return AVal(pc.is_valid(t(n.args[0]).arr), BOOL)


def fn_abs(t: Any, n: Call) -> AVal:
    v = t(n.args[0])
    if v.type in (LONG, BOOL):  # abs(MIN) overflows: null, as every LONG overflow
        x = as_long(v)
        return AVal(pc.if_else(pc.equal(x, -(2 ** 63)), pa.scalar(None, pa.int64()), pc.abs(x)), LONG)
    return AVal(pc.abs(as_double(v)), DOUBLE)


def _when(conds: list[pa.Array], values: list[pa.Array], default: pa.Array | None,
          typ: pa.DataType) -> pa.Array:
    out = default if default is not None else pa.nulls(len(values[0]), typ)
    for c, v in reversed(list(zip(conds, values))):
        out = pc.if_else(pc.fill_null(c, False), v, out)
    return out


def fn_if(t: Any, n: Call) -> AVal:
    kind, (then, other) = common([t(n.args[1]), t(n.args[2])])
    return AVal(_when([as_bool(t(n.args[0]))], [then], other, then.type), kind)


def _cases(conds: list[pa.Array], values: list[AVal], default: AVal | None) -> AVal:
    kind, cols = common(values + ([default] if default else []))
    return AVal(_when(conds, cols[:len(conds)], cols[-1] if default else None, cols[0].type), kind)


def fn_case_searched(t: Any, n: Call) -> AVal:
    args = list(n.args)
    default = t(args.pop()) if len(args) % 2 else None
    return _cases([as_bool(t(a)) for a in args[0::2]], [t(a) for a in args[1::2]], default)


def fn_case_simple(t: Any, n: Call) -> AVal:
    subject, args = n.args[0], list(n.args[1:])
    default = t(args.pop()) if len(args) % 2 else None
    x = t(subject)
    conds = [binary("==", x, t(a)).arr for a in args[0::2]]
    return _cases(conds, [t(a) for a in args[1::2]], default)


def fn_like(t: Any, n: Call) -> AVal:
    lits = _lits(n) + [None]
    regex = java_regex(like_to_regex(lits[1], lits[2]))
    return AVal(pc.match_substring_regex(as_string(t(n.args[0])), str(regex)), BOOL)


def fn_regexp_like(t: Any, n: Call) -> AVal:
    return AVal(pc.match_substring_regex(as_string(t(n.args[0])), str(java_regex(str(_lits(n)[1])))),
                BOOL)


def fn_regexp_extract(t: Any, n: Call) -> AVal:
    s = as_string(t(n.args[0]))
    lits = _lits(n)
    pattern, group = str(lits[1]), int(lits[2]) if len(lits) > 2 else 0
    found = pc.extract_regex(s, named_groups(str(java_regex(pattern, find_only=False))))
    return AVal(pc.struct_field(found, [group]), STRING)


def fn_timestamp_floor(t: Any, n: Call) -> AVal:
    ms = as_long(t(n.args[0]))
    lits = _lits(n) + [None, None]
    unit, count = parse_period(lits[1])
    fixed = period_millis(unit, count)
    x, ok = ms.fill_null(0).to_numpy(zero_copy_only=False), pc.is_valid(ms).to_numpy(zero_copy_only=False)
    if fixed is not None:
        weekly = unit == "week" and count == 1 and lits[2] is None  # ISO weeks: Mondays
        base = MONDAY_OFFSET if weekly else int(lits[2] or 0)
        with np.errstate(over="ignore"):
            return AVal(masked(x - np.mod(x - base, WEEK if weekly else fixed), ok, pa.int64()), LONG)
    months = count * (12 if unit == "year" else 1)
    m = x.astype("datetime64[ms]").astype("datetime64[M]").astype(np.int64)
    start = (m - np.mod(m, months)).astype("datetime64[M]").astype("datetime64[ms]").astype(np.int64)
    return AVal(masked(start, ok, pa.int64()), LONG)


def fn_timestamp_parse(t: Any, n: Call) -> AVal:
    s = as_string(t(n.args[0]))
    pattern = (_lits(n) + [None])[1]
    micros = to_micros(s) if pattern is None else _parse_pattern(s, str(pattern))
    ms = micros.fill_null(0).to_numpy(zero_copy_only=False)
    return AVal(masked(np.floor_divide(ms, 1000), pc.is_valid(micros).to_numpy(
        zero_copy_only=False), pa.int64()), LONG)


def _parse_pattern(s: pa.Array, pattern: str) -> pa.Array:
    """``try_to_timestamp(s, pattern)`` for fixed-width letters (java.time: exact width,
    the whole text, a date that exists) as epoch micros."""
    parts = pattern_parts(pattern) or []
    regex = "".join(f"(?P<{p}>[0-9]{{{PATTERN_FIELDS[p]}}})" if is_field else re.escape(p)
                    for is_field, p in parts)
    letters = [p for is_field, p in parts if is_field]
    n = len(s)
    found = pc.extract_regex(s, f"^{regex}$") if letters else None
    ok = (pc.is_valid(found).to_numpy(zero_copy_only=False) if found is not None
          else pc.fill_null(pc.equal(s, "".join(p for _, p in parts)), False).to_numpy(zero_copy_only=False))

    def get(name: str, default: int) -> np.ndarray:
        if name not in letters or found is None:
            return np.full(n, default, dtype=np.int64)
        col = pc.fill_null(pc.struct_field(found, [letters.index(name)]), "0")
        return col.cast(pa.int64()).to_numpy(zero_copy_only=False)

    y, mo, d = get("yyyy", 1970), get("MM", 1), get("dd", 1)
    h, mi, sec, frac = get("HH", 0), get("mm", 0), get("ss", 0), get("SSS", 0)
    valid = ok & (y >= 1) & (mo >= 1) & (mo <= 12) & (d >= 1) & (h <= 23) & (mi <= 59) & (sec <= 59)
    from shuffled.spark.phase1.spark_compat.timestamps import days_from_civil, days_in_month

    valid &= d <= days_in_month(y, np.clip(mo, 1, 12))
    days = days_from_civil(y, np.clip(mo, 1, 12), d)
    micros = ((days * 86400 + h * 3600 + mi * 60 + sec) * 1000 + frac) * 1000
    return masked(np.where(valid, micros, 0), valid, pa.int64())


def fn_timestamp_format(t: Any, n: Call) -> AVal:
    ms = as_long(t(n.args[0]))
    pattern = (_lits(n) + [None])[1]
    parts = pattern_parts(_ISO if pattern is None else str(pattern)) or []
    x = ms.fill_null(0).to_numpy(zero_copy_only=False)
    ok = pc.is_valid(ms).to_numpy(zero_copy_only=False)
    dt = x.astype("datetime64[ms]")
    days = dt.astype("datetime64[D]")
    fields = {"yyyy": dt.astype("datetime64[Y]").astype(np.int64) + 1970,
              "MM": dt.astype("datetime64[M]").astype(np.int64) % 12 + 1,
              "dd": (days - dt.astype("datetime64[M]").astype("datetime64[D]")).astype(np.int64) + 1,
              "HH": np.floor_divide(np.mod(x, 86_400_000), 3_600_000),
              "mm": np.floor_divide(np.mod(x, 3_600_000), 60_000),
              "ss": np.floor_divide(np.mod(x, 60_000), 1000), "SSS": np.mod(x, 1000)}
    out = None
    zeros = pa.array(np.zeros(len(x), dtype=np.int64))
    for is_field, p in parts:
        piece = (pc.utf8_lpad(pa.array(fields[p]).cast(pa.string()), PATTERN_FIELDS[p], "0")
                 if is_field else pa.array([p], pa.string()).take(zeros))
        out = piece if out is None else pc.binary_join_element_wise(out, piece, "")
    if out is None:
        out = pa.array([""] * len(x), pa.string())
    return AVal(pc.if_else(pa.array(ok), out, pa.scalar(None, pa.string())), STRING)


def fn_cast(t: Any, n: Call) -> AVal:
    v = t(n.args[0])
    kind = str(_lits(n)[1]).upper()
    if kind == "LONG":
        return AVal(as_long(v), LONG)
    if kind in ("DOUBLE", "FLOAT"):
        return AVal(as_double(v), DOUBLE)
    return AVal(as_string(v), STRING)
