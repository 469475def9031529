"""``transformSpec.filter`` as a Spark boolean Column, with Druid's SQL-compatible null rules.

A filter on a null value is null (unknown); ``not`` keeps it unknown; the caller drops every
row whose filter is not true. Selector, in and equality compare strings as strings and
numbers numerically (a non-numeric value never equals a number); ``bound`` orders
lexicographically (Spark's UTF-8 byte order) or numerically; like and regex match the value
as a string.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from shuffled.spark.phase1.jvm.sqlexpr import NULL, STRING, Translator, Val, as_bool, as_double, as_long, as_string
from shuffled.spark.spec.transform import Filter


def _parse_number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _equals(v: Val, value: str | int | float | None) -> Column:
    """Druid's selector match of one value: strings as strings, numbers numerically."""
    if value is None:
        return v.col.isNull()
    if v.type == STRING or v.type == NULL:
        return as_string(v) == F.lit(str(value))
    number = _parse_number(value)
    if number is None:  # a number never equals a non-numeric value (unknown when null)
        return F.when(v.col.isNotNull(), F.lit(False))
    return as_double(v) == F.lit(number)


def filter_column(f: Filter, columns: dict[str, Val], path: str) -> Column:
    """The filter as a boolean Column: true keeps the row; false or null (unknown) drops it."""
    def col(name: str | None) -> Val:
        got = columns.get(name or "")
        return got if got is not None else Val(F.lit(None).cast("string"), NULL)

    kind = f.type
    if kind in ("true", "false"):
        return F.lit(kind == "true")
    if kind in ("and", "or"):
        parts = [filter_column(c, columns, path) for c in f.children]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if kind == "and" else (out | p)
        return out
    if kind == "not":
        return ~filter_column(f.children[0], columns, path)
    if kind == "expression":
        assert f.node is not None
        return as_bool(Translator(columns, path)(f.node))
    v = col(f.column)
    if kind == "selector":
        return _equals(v, f.values[0])
    if kind == "in":
        conds = [_equals(v, x) for x in f.values]
        if not conds:
            return F.when(v.col.isNotNull(), F.lit(False))
        out = conds[0]
        for c in conds[1:]:
            out = out | c
        return out
    if kind == "equality":
        value = f.values[0]
        if f.ordering == "STRING":
            return _equals(v, value)
        return as_double(v) == F.lit(float(value))  # type: ignore[arg-type]
    if kind in ("bound", "range"):
        numeric = f.ordering not in ("lexicographic", "STRING")
        x = as_double(v) if numeric else as_string(v)
        out = v.col.isNotNull()
        for bound, is_open, lower in ((f.lower, f.lower_open, True), (f.upper, f.upper_open, False)):
            if bound is None:
                continue
            b = F.lit(float(bound)) if numeric else F.lit(str(bound))
            out = out & ((x > b if is_open else x >= b) if lower else (x < b if is_open else x <= b))
        return F.when(v.col.isNotNull(), out)
    if kind in ("like", "regex"):
        return as_string(v).rlike(str(f.pattern))
    if kind == "null":
        return v.col.isNull()
    assert kind == "interval"
    t = as_long(v)
    either: Column | None = None
    for iv in f.intervals:
        part = (t >= F.lit(iv.start)) & (t < F.lit(iv.end))
        either = part if either is None else (either | part)
    assert either is not None
    return either
