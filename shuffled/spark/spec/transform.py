"""``dataSchema.transformSpec``: expression transforms and the row filter, parsed and checked.

Transforms see the input row after ``timestampSpec`` (``__time`` is the parsed timestamp in
epoch millis) and may shadow an input field or ``__time``; they cannot refer to each other
(Druid's rule: each reads the input row). The filter sees the row after the transforms.
Filters follow Druid's SQL-compatible null handling (the default since Druid 28): a filter
on a null value is *unknown*, ``not`` of unknown is unknown, and unknown rows are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shuffled.protocol import Interval
from shuffled.spark.spec.base import JsonObject, SpecError, choice, interval_list
from shuffled.spark.spec.expr import Node, identifiers, parse_expr
from shuffled.spark.spec.patterns import PatternError, check_regex, like_to_regex

TIME = "__time"
#: Filter types translated (see :func:`parse_filter`); every other Druid filter is refused.
FILTER_TYPES = ("selector", "equality", "in", "bound", "range", "like", "regex", "null",
                "interval", "true", "false", "and", "or", "not", "expression")
BOUND_ORDERINGS = ("lexicographic", "numeric")
MATCH_TYPES = ("STRING", "LONG", "DOUBLE", "FLOAT")


@dataclass(frozen=True)
class Transform:
    name: str
    expression: str
    node: Node


@dataclass(frozen=True)
class Filter:
    """One node of a filter tree; which fields are set depends on ``type``.

    ``column``: the column filtered; ``values``: selector/in values (None = null);
    ``lower``/``upper`` with ``lower_open``/``upper_open``: bound/range; ``ordering``:
    ``lexicographic``, ``numeric`` (bound) or a match type (equality/range);
    ``pattern``: like (as an anchored regex) or regex; ``intervals``: interval filter;
    ``children``: and/or/not; ``node``: expression filter.
    """

    type: str
    column: str | None = None
    values: tuple[str | int | float | None, ...] = ()
    lower: str | int | float | None = None
    upper: str | int | float | None = None
    lower_open: bool = False
    upper_open: bool = False
    ordering: str = "lexicographic"
    pattern: str | None = None
    intervals: tuple[Interval, ...] = ()
    children: tuple[Filter, ...] = ()
    node: Node | None = None

    def columns(self) -> set[str]:
        """Every column the filter reads."""
        out = {self.column} if self.column else set()
        if self.node is not None:
            out |= identifiers(self.node)
        for c in self.children:
            out |= c.columns()
        return out


@dataclass(frozen=True)
class TransformSpec:
    transforms: tuple[Transform, ...] = ()
    filter: Filter | None = None

    def __bool__(self) -> bool:
        return bool(self.transforms) or self.filter is not None

    @property
    def reads(self) -> set[str]:
        """Input fields the transforms and filter read (``__time`` excluded)."""
        out: set[str] = set()
        for t in self.transforms:
            out |= identifiers(t.node)
        if self.filter is not None:
            out |= self.filter.columns() - {t.name for t in self.transforms}
        return out - {TIME}


def parse_transform_spec(o: JsonObject) -> TransformSpec:
    raw = o.get("transforms", [])
    if not isinstance(raw, list):
        raise SpecError(o.at("transforms"), "must be a list of transforms")
    out: list[Transform] = []
    for i, item in enumerate(raw):
        t = JsonObject(item, f"{o.at('transforms')}[{i}]")
        choice(t, "type", ("expression",), "expression")
        name = t.str_("name", required=True)
        assert name is not None
        if name.startswith("__") and name != TIME:
            raise SpecError(t.at("name"), f"{name!r}: only __time may be named with a leading '__'")
        text = t.str_("expression", required=True)
        assert text is not None
        out.append(Transform(name, text, parse_expr(text, t.at("expression"))))
        t.done()
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise SpecError(o.at("transforms"), "names a transform twice")
    flt = o.value.get("filter")
    parsed = parse_filter(flt, o.at("filter")) if flt is not None else None
    o.get("filter")
    o.done()
    return TransformSpec(tuple(out), parsed)


def _column(f: JsonObject, *keys: str) -> str:
    for key in keys:
        if f.value.get(key) is not None:
            value = f.str_(key)
            assert value is not None
            return value
    raise SpecError(f.at(keys[0]), "is required")


def _scalar(value: Any, path: str, *, null: bool = False) -> str | int | float | None:
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecError(path, f"must be a string or a number, not {value!r}")
    return value


def parse_filter(raw: Any, path: str) -> Filter:
    """A Druid filter, or SpecError naming the unsupported filter type by path."""
    f = JsonObject(raw, path)
    kind = f.str_("type", required=True)
    if kind not in FILTER_TYPES:
        raise SpecError(f.at("type"), f"filter type {kind!r} is not supported "
                        f"(one of {', '.join(FILTER_TYPES)})")
    if f.value.get("extractionFn") is not None:
        raise SpecError(f.at("extractionFn"), "is not supported")
    f.get("extractionFn")
    f.get("filterTuning")  # only tunes Druid's query-time bitmap use
    out = _FILTERS[kind](f, kind)
    f.done()
    return out


def _selector(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "dimension")
    return Filter(kind, col, (_scalar(f.get("value"), f.at("value"), null=True),))


def _equality(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "column")
    match = choice(f, "matchValueType", MATCH_TYPES, None)
    value = f.value.get("matchValue")
    f.get("matchValue")
    if value is None:
        raise SpecError(f.at("matchValue"), "is required (use a null filter to match nulls)")
    if match != "STRING" and _number(value) is None:
        raise SpecError(f.at("matchValue"), f"{value!r} is not a {match}")
    return Filter(kind, col, (_scalar(value, f.at("matchValue")),), ordering=match)


def _in(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "dimension")
    values = f.get("values")
    if not isinstance(values, list):
        raise SpecError(f.at("values"), "must be a list of values")
    return Filter(kind, col, tuple(_scalar(v, f"{f.at('values')}[{i}]", null=True)
                                   for i, v in enumerate(values)))


def _bound(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "dimension")
    ordering = f.get("ordering", "lexicographic")
    if isinstance(ordering, dict):
        ordering = ordering.get("type")
    if ordering not in BOUND_ORDERINGS:
        raise SpecError(f.at("ordering"), f"{ordering!r} is not supported (one of {', '.join(BOUND_ORDERINGS)})")
    lower = _scalar(f.get("lower"), f.at("lower"), null=True)
    upper = _scalar(f.get("upper"), f.at("upper"), null=True)
    if ordering == "numeric":
        _numeric_bounds(f, lower, upper, "a number (numeric ordering)")
    return Filter(kind, col, lower=lower, upper=upper, lower_open=f.bool_("lowerStrict", False),
                  upper_open=f.bool_("upperStrict", False), ordering=ordering)


def _numeric_bounds(f: JsonObject, lower: Any, upper: Any, what: str) -> None:
    """Refuse a bound of a numeric bound/range filter that is not a number, by its path."""
    for key, v in (("lower", lower), ("upper", upper)):
        if v is not None and _number(v) is None:
            raise SpecError(f.at(key), f"{v!r} is not {what}")


def _range(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "column")
    match = choice(f, "matchValueType", MATCH_TYPES, None)
    lower = _scalar(f.get("lower"), f.at("lower"), null=True)
    upper = _scalar(f.get("upper"), f.at("upper"), null=True)
    if match != "STRING":
        _numeric_bounds(f, lower, upper, f"a {match}")
    return Filter(kind, col, lower=lower, upper=upper, lower_open=f.bool_("lowerOpen", False),
                  upper_open=f.bool_("upperOpen", False), ordering=match)


def _like(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "dimension")
    try:
        regex = like_to_regex(f.get("pattern"), f.get("escape"))
    except PatternError as exc:
        raise SpecError(f.at("pattern"), str(exc)) from None
    return Filter(kind, col, pattern=regex)


def _regex(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "dimension")
    try:
        return Filter(kind, col, pattern=check_regex(f.get("pattern")))
    except PatternError as exc:
        raise SpecError(f.at("pattern"), str(exc)) from None


def _null(f: JsonObject, kind: str) -> Filter:
    return Filter(kind, _column(f, "column"))


def _interval(f: JsonObject, kind: str) -> Filter:
    col = _column(f, "dimension")
    ivs = interval_list(f.get("intervals"), f.at("intervals"))
    if not ivs:
        raise SpecError(f.at("intervals"), "must be a list of 'start/end' strings")
    return Filter(kind, col, intervals=tuple(ivs))


def _constant(f: JsonObject, kind: str) -> Filter:
    return Filter(kind)


def _logical(f: JsonObject, kind: str) -> Filter:
    if kind == "not":
        return Filter(kind, children=(parse_filter(f.get("field"), f.at("field")),))
    fields = f.get("fields")
    if not isinstance(fields, list) or not fields:
        raise SpecError(f.at("fields"), "must be a non-empty list of filters")
    return Filter(kind, children=tuple(parse_filter(x, f"{f.at('fields')}[{i}]")
                                       for i, x in enumerate(fields)))


def _expression(f: JsonObject, kind: str) -> Filter:
    text = f.str_("expression", required=True)
    assert text is not None
    return Filter(kind, node=parse_expr(text, f.at("expression")))


def _number(v: str | int | float) -> float | None:
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except ValueError:
        return None


_FILTERS = {
    "selector": _selector, "equality": _equality, "in": _in, "bound": _bound, "range": _range,
    "like": _like, "regex": _regex, "null": _null, "interval": _interval, "true": _constant,
    "false": _constant, "and": _logical, "or": _logical, "not": _logical,
    "expression": _expression,
}
