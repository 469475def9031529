"""``transformSpec`` on Arrow: the same values :mod:`shuffled.spark.phase1.jvm.sqlexpr` and :mod:`shuffled.spark.phase1.jvm.filters` compute in
Spark SQL, on whole arrays (never row by row in Python).

:class:`ArrowTranslator` evaluates expression ASTs (:mod:`shuffled.spark.spec.expr`) with
:mod:`shuffled.spark.phase1.arrow_expr.values`' types and operators and :mod:`shuffled.spark.phase1.arrow_expr.functions`; the transforms and
the filter apply as :mod:`shuffled.spark.phase1.jvm.prepare` applies them.

Filters follow :mod:`shuffled.spark.phase1.jvm.filters` (Druid's SQL-compatible null rules: a filter on null is
unknown, ``not`` keeps it unknown, a row is kept only when its filter is true).
:func:`unsupported` tells, before any task runs, what this translation cannot compute
(non-literal arguments Arrow needs as constants, regular expressions RE2 does not read the
way Java does, timestamp patterns beyond fixed-width numbers): the spec then takes the JVM
reader and ``readerReason`` names the function or filter.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.phase1.arrow_expr.functions import pattern_parts
from shuffled.spark.phase1.arrow_expr.regex import java_regex, named_groups
from shuffled.spark.phase1.arrow_expr import functions as arrow_functions
from shuffled.spark.phase1.arrow_expr.values import (BOOL, LONG, NULL, STRING, AVal, as_bool,
                                                as_double, as_long, as_string, as_value, binary,
                                                compare, literal, negate, nulls)
from shuffled.spark.spec.expr import Binary, Call, Ident, Lit, Node, Unary
from shuffled.spark.spec.transform import TIME, Filter, TransformSpec



class ArrowTranslator:
    """Evaluates expression ASTs over ``columns`` (name -> AVal) of ``n`` rows."""

    def __init__(self, columns: dict[str, AVal], n: int) -> None:
        self.columns = columns
        self.n = n

    def __call__(self, node: Node) -> AVal:
        if isinstance(node, Lit):
            return literal(node.value, self.n)
        if isinstance(node, Ident):
            return self.columns.get(node.name) or nulls(self.n, NULL)
        if isinstance(node, Unary):
            arg = self(node.arg)
            return AVal(pc.invert(as_bool(arg)), BOOL) if node.op == "!" else negate(arg)
        if isinstance(node, Binary):
            return binary(node.op, self(node.left), self(node.right))
        assert isinstance(node, Call)
        return getattr(arrow_functions, f"fn_{node.fn}")(self, node)


def apply_transforms(spec: TransformSpec, inputs: dict[str, pa.Array], millis: pa.Array,
                     ) -> tuple[dict[str, AVal], np.ndarray, pa.Array]:
    """The transforms' outputs (by name), whether the filter keeps each row, and the row
    time (a ``__time`` transform's LONG value, null if it is not a LONG)."""
    n = len(millis)
    before = {TIME: AVal(millis, LONG)}
    before.update({k: AVal(v, STRING) for k, v in inputs.items()})
    after = dict(before)
    for t in spec.transforms:
        after[t.name] = as_value(ArrowTranslator(before, n)(t.node))
    keep = np.ones(n, dtype=bool)
    if spec.filter is not None:
        keep = pc.fill_null(filter_array(spec.filter, after, n), False).to_numpy(zero_copy_only=False)
    time = after[TIME]
    time_arr = time.arr.cast(pa.int64()) if time.type == LONG else pa.nulls(n, pa.int64())
    produced = {t.name: after[t.name] for t in spec.transforms if t.name != TIME}
    return produced, keep, time_arr


def _equals(v: AVal, value: str | int | float | None, n: int) -> pa.Array:
    if value is None:
        return pc.is_null(v.arr)
    if v.type in (STRING, NULL):
        return pc.equal(as_string(v), str(value))
    try:
        number = float(value)
    except ValueError:  # a number never equals a non-numeric value (unknown when null)
        return pc.if_else(pc.is_valid(v.arr), False, pa.scalar(None, pa.bool_()))
    return compare("==", as_double(v), pa.array(np.full(n, number)))


def filter_array(f: Filter, columns: dict[str, AVal], n: int) -> pa.Array:
    """The filter as a boolean array (null: unknown)."""
    kind = f.type
    if kind in ("true", "false"):
        return pa.array(np.full(n, kind == "true"))
    if kind in ("and", "or"):
        parts = [filter_array(c, columns, n) for c in f.children]
        out = parts[0]
        for p in parts[1:]:
            out = pc.and_kleene(out, p) if kind == "and" else pc.or_kleene(out, p)
        return out
    if kind == "not":
        return pc.invert(filter_array(f.children[0], columns, n))
    if kind == "expression":
        assert f.node is not None
        return as_bool(ArrowTranslator(columns, n)(f.node))
    v = columns.get(f.column or "") or AVal(pa.nulls(n, pa.string()), NULL)
    if kind == "selector":
        return _equals(v, f.values[0], n)
    if kind == "in":
        conds = [_equals(v, x, n) for x in f.values]
        if not conds:
            return pc.if_else(pc.is_valid(v.arr), False, pa.scalar(None, pa.bool_()))
        out = conds[0]
        for c in conds[1:]:
            out = pc.or_kleene(out, c)
        return out
    if kind == "equality":
        if f.ordering == "STRING":
            return _equals(v, f.values[0], n)
        return compare("==", as_double(v), pa.array(np.full(n, float(f.values[0]))))  # type: ignore[arg-type]
    if kind in ("bound", "range"):
        numeric = f.ordering not in ("lexicographic", "STRING")
        x = as_double(v) if numeric else as_string(v)
        out = pc.is_valid(v.arr)
        for bound, is_open, lower in ((f.lower, f.lower_open, True), (f.upper, f.upper_open, False)):
            if bound is None:
                continue
            b = pa.array(np.full(n, float(bound))) if numeric else literal(str(bound), n).arr
            op = (">" if is_open else ">=") if lower else ("<" if is_open else "<=")
            out = pc.and_kleene(out, compare(op, x, b))
        return pc.if_else(pc.is_valid(v.arr), out, pa.scalar(None, pa.bool_()))
    if kind in ("like", "regex"):
        return pc.match_substring_regex(as_string(v), str(java_regex(str(f.pattern))))
    if kind == "null":
        return pc.is_null(v.arr)
    assert kind == "interval"
    t = as_long(v)
    out = None
    for iv in f.intervals:
        part = pc.and_(pc.greater_equal(t, iv.start), pc.less(t, iv.end))
        out = part if out is None else pc.or_kleene(out, part)
    assert out is not None
    return out


def _regex_problem(pattern: str, find_only: bool = True) -> str | None:
    translated = java_regex(pattern, find_only)
    if translated is None:
        return f"the regular expression {pattern!r} (Java syntax RE2 reads otherwise)"
    try:
        pc.match_substring_regex(pa.array([""]), named_groups(translated))
    except pa.ArrowInvalid:
        return f"the regular expression {pattern!r} (RE2 cannot compile it)"
    return None


def _node_problem(node: Node) -> str | None:
    if isinstance(node, Unary):
        return _node_problem(node.arg)
    if isinstance(node, Binary):
        return _node_problem(node.left) or _node_problem(node.right)
    if not isinstance(node, Call):
        return None
    for a in node.args:
        found = _node_problem(a)
        if found:
            return found
    lits = [a.value if isinstance(a, Lit) else None for a in node.args]
    if node.fn in ("substring", "replace") and not all(isinstance(a, Lit) for a in node.args[1:]):
        return f"function {node.fn} with computed arguments (Arrow takes them as constants)"
    if node.fn in ("regexp_like", "regexp_extract"):
        found = _regex_problem(str(lits[1]), find_only=node.fn == "regexp_like")
        return f"function {node.fn}: {found}" if found else None
    if node.fn in ("timestamp_parse", "timestamp_format") and len(lits) > 1 and lits[1] is not None:
        if pattern_parts(str(lits[1])) is None:
            return (f"function {node.fn} with the pattern {lits[1]!r} (natively: yyyy MM dd "
                    "HH mm ss SSS and literal text)")
    return None


def _filter_problem(f: Filter) -> str | None:
    for c in f.children:
        found = _filter_problem(c)
        if found:
            return found
    if f.node is not None:
        return _node_problem(f.node)
    if f.type in ("regex", "like") and f.pattern is not None:
        found = _regex_problem(f.pattern)
        return f"the regex filter: {found}" if found else None
    return None


def unsupported(spec: TransformSpec) -> str | None:
    """Why the Arrow translation cannot compute ``spec`` (None: it can)."""
    for t in spec.transforms:
        found = _node_problem(t.node)
        if found:
            return f"transform {t.name!r}: {found}"
    if spec.filter is not None:
        found = _filter_problem(spec.filter)
        if found:
            return f"transformSpec.filter: {found}"
    return None
