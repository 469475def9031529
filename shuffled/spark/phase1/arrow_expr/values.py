"""Values of Druid expressions on Arrow: types, coercions, operators (see :mod:`shuffled.spark.phase1.arrow_expr.transform`).

Every value has the static Druid type the Spark translation gives it (``LONG``, ``DOUBLE``,
``STRING``, ``BOOL``, ``NULL``) and the same coercions, null rules and Spark semantics:
ANSI ``try_`` arithmetic (LONG overflow and division by zero are null), Java's long
division and remainder, Spark's NaN ordering (NaN equals NaN and is above every number),
``try_cast`` of text (:mod:`shuffled.spark.phase1.spark_compat.casts`). Functions are in :mod:`shuffled.spark.phase1.arrow_expr.functions`, the
translator of ASTs, the filters and what cannot be expressed in :mod:`shuffled.spark.phase1.arrow_expr.transform`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.phase1.spark_compat.casts import to_double, to_long
from shuffled.spark.phase1.spark_compat.java_text import java_double_text
from shuffled.spark.spec.expr import (BOOL, DOUBLE, LONG, NULL, STRING,
                                      branch_type)

_MIN, _MAX = -(2 ** 63), 2 ** 63 - 1
_TYPES = {LONG: pa.int64(), DOUBLE: pa.float64(), STRING: pa.string(), BOOL: pa.bool_(),
          NULL: pa.string()}


@dataclass(frozen=True)
class AVal:
    """A translated value: the Arrow array (one value per row) and its Druid type."""

    arr: pa.Array
    type: str


def _np(a: pa.Array, fill: object = 0) -> np.ndarray:
    return a.fill_null(fill).to_numpy(zero_copy_only=False)


def _valid(a: pa.Array) -> np.ndarray:
    return pc.is_valid(a).to_numpy(zero_copy_only=False)


def masked(values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.array(values, typ, mask=~valid)


def nulls(n: int, kind: str) -> AVal:
    return AVal(pa.nulls(n, _TYPES[kind]), kind)


def literal(value: int | float | str | None, n: int) -> AVal:
    if value is None:
        return nulls(n, NULL)
    kind = LONG if isinstance(value, int) else DOUBLE if isinstance(value, float) else STRING
    return AVal(pa.array([value], _TYPES[kind]).take(pa.array(np.zeros(n, dtype=np.int64))), kind)


# --- coercions (sqlexpr.py's as_double, as_long, as_string, as_bool, as_value) ---------

def as_double(v: AVal) -> pa.Array:
    if v.type == STRING:
        return to_double(v.arr)
    return v.arr.cast(pa.float64(), safe=False) if v.type != NULL else pa.nulls(len(v.arr), pa.float64())


def double_to_long(d: pa.Array) -> pa.Array:
    """``try_cast(double AS BIGINT)``: toward zero; null for NaN and what does not fit
    (Spark lets through up to 2^63 and saturates)."""
    x = _np(d, 0.0).astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = _valid(d) & (np.floor(x) <= 2.0 ** 63) & (np.ceil(x) >= -(2.0 ** 63))
    t = np.trunc(np.where(ok, x, 0.0))
    big = t >= 2.0 ** 63
    out = np.where(big, 0, t).astype(np.int64)
    out[big] = _MAX
    return masked(out, ok, pa.int64())


def as_long(v: AVal) -> pa.Array:
    """Druid's ``asLong``: a long as is, else the number truncated toward zero."""
    if v.type in (LONG, BOOL):
        return v.arr.cast(pa.int64())
    if v.type == DOUBLE:
        return double_to_long(v.arr)
    if v.type == NULL:
        return pa.nulls(len(v.arr), pa.int64())
    return pc.coalesce(to_long(v.arr), double_to_long(to_double(v.arr)))


def as_string(v: AVal) -> pa.Array:
    if v.type == STRING:
        return v.arr
    if v.type == BOOL:
        return v.arr.cast(pa.int64()).cast(pa.string())
    if v.type == DOUBLE:
        return java_double_text(v.arr)  # Spark's cast of a double to text: Java's toString
    return v.arr.cast(pa.string())


def as_bool(v: AVal) -> pa.Array:
    """Druid's truthiness: numbers > 0 (Spark: NaN too); strings equal to 'true' ignoring case."""
    if v.type == BOOL:
        return v.arr
    if v.type == STRING:
        return pc.equal(pc.utf8_lower(v.arr), "true")
    if v.type == NULL:
        return pa.nulls(len(v.arr), pa.bool_())
    return compare(">", v.arr, pa.array(np.zeros(len(v.arr)), v.arr.type))


def as_value(v: AVal) -> AVal:
    """What a transform outputs: BOOL becomes LONG 1/0, NULL a null string."""
    if v.type == BOOL:
        return AVal(v.arr.cast(pa.int64()), LONG)
    if v.type == NULL:
        return AVal(pa.nulls(len(v.arr), pa.string()), STRING)
    return v


def cast_value(v: AVal, kind: str) -> pa.Array:
    """A typed transform output as a dimension or metric of ``kind`` (Spark's try_cast)."""
    if kind == "string":
        return as_string(v)
    if kind == "long":
        return as_long(v) if v.type != STRING else to_long(v.arr)
    d = as_double(v)
    return d if kind == "double" else d.cast(pa.float32(), safe=False)


def common(vals: list[AVal]) -> tuple[str, list[pa.Array]]:
    """One type for the branches of if/case/nvl (sqlexpr.common)."""
    kind = branch_type({v.type for v in vals})
    conv = {BOOL: as_bool, LONG: as_long, DOUBLE: as_double, STRING: as_string}[kind]
    return kind, [conv(v).cast(_TYPES[kind], safe=False) for v in vals]


def compare(op: str, x: pa.Array, y: pa.Array) -> pa.Array:
    """``x op y`` as Spark compares: strings by UTF-8 bytes, doubles with NaN equal to NaN
    and above every number; null if either side is null."""
    fn = {"<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal,
          "==": pc.equal, "!=": pc.not_equal}[op]
    if not pa.types.is_floating(x.type):
        return fn(x, y)
    nx, ny = pc.is_nan(x), pc.is_nan(y)
    both, either = pc.and_(nx, ny), pc.or_(nx, ny)
    if op in ("==", "!="):
        eq = pc.or_(pc.and_(pc.invert(either), pc.equal(x, y)), both)
        return eq if op == "==" else pc.invert(eq)
    # With a NaN: x < y iff only y is NaN; x > y iff only x is NaN; <= and >= add both.
    if op in ("<", "<="):
        nan_case = pc.and_(pc.invert(nx), ny) if op == "<" else ny
    else:
        nan_case = pc.and_(nx, pc.invert(ny)) if op == ">" else nx
    return pc.if_else(either, nan_case, fn(x, y))


def _long_arith(op: str, x: pa.Array, y: pa.Array) -> pa.Array:
    """LONG + - * / % with Spark's try_ semantics (overflow and division by zero: null)."""
    a, b = _np(x).astype(np.int64), _np(y).astype(np.int64)
    ok = _valid(x) & _valid(y)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if op == "+":
            r = a + b
            ok &= ((a ^ r) & (b ^ r)) >= 0
        elif op == "-":
            r = a - b
            ok &= ((a ^ b) & (a ^ r)) >= 0
        elif op == "*":
            r = a * b
            safe_a = np.where(a == 0, 1, a)
            ok &= (a == 0) | ((r // safe_a == b) & ~((a == -1) & (b == _MIN)) & ~((b == -1) & (a == _MIN)))
        else:
            zero = b == 0
            ok &= ~zero
            wraps = (b == -1) & (a == _MIN)
            safe_b = np.where(zero | wraps, 1, b)
            if op == "/":  # Java: toward zero; MIN / -1 wraps to MIN
                q = a // safe_b
                q = q + ((q * safe_b != a) & ((a < 0) != (safe_b < 0)))
                r = np.where(wraps, _MIN, q)
            else:  # Java's remainder takes the dividend's sign
                r = np.where(wraps, 0, np.fmod(a, safe_b))
    return masked(np.where(ok, r, 0), ok, pa.int64())


def _double_arith(op: str, x: pa.Array, y: pa.Array) -> pa.Array:
    a, b = _np(x, 0.0).astype(np.float64), _np(y, 0.0).astype(np.float64)
    ok = _valid(x) & _valid(y)
    with np.errstate(all="ignore"):
        if op == "+":
            r = a + b
        elif op == "-":
            r = a - b
        elif op == "*":
            r = a * b
        elif op == "/":  # by zero: +-Infinity by x's sign (Spark: NaN counts as above 0)
            sign = np.where(np.isnan(a) | (a > 0), np.inf, np.where(a < 0, -np.inf, np.nan))
            r = np.where(b == 0, sign, a / np.where(b == 0, 1.0, b))
        elif op == "%":
            r = np.where(b == 0, np.nan, np.fmod(a, np.where(b == 0, 1.0, b)))
        else:  # Java's Math.pow where C's pow differs
            r = np.power(a, b)
            r = np.where(np.isnan(b) | ((np.abs(a) == 1) & np.isinf(b)), np.nan, r)
            r = np.where(b == 0, 1.0, r)
    return masked(r, ok, pa.float64())


def _numeric_type(a: AVal, b: AVal) -> str:
    return LONG if a.type in (LONG, BOOL, NULL) and b.type in (LONG, BOOL, NULL) else DOUBLE


def _num(v: AVal, kind: str) -> pa.Array:
    return as_long(v) if kind == LONG else as_double(v)


def binary(op: str, a: AVal, b: AVal) -> AVal:
    """``a op b`` (sqlexpr.Translator.binary)."""
    if op in ("&&", "||"):
        fn = pc.and_kleene if op == "&&" else pc.or_kleene
        return AVal(fn(as_bool(a), as_bool(b)), BOOL)
    if op in ("<", "<=", ">", ">=", "==", "!="):
        if a.type == STRING and b.type == STRING:
            return AVal(compare(op, a.arr, b.arr), BOOL)
        kind = _numeric_type(a, b)
        return AVal(compare(op, _num(a, kind), _num(b, kind)), BOOL)
    if op == "+" and a.type == STRING and b.type == STRING:
        return AVal(pc.binary_join_element_wise(a.arr, b.arr, "", null_handling="emit_null"),
                    STRING)
    kind = _numeric_type(a, b)
    x, y = _num(a, kind), _num(b, kind)
    if kind == LONG:
        if op == "^":  # Spark: pow in doubles, then try_cast to BIGINT; null below 0
            p = double_to_long(_double_arith("^", x.cast(pa.float64(), safe=False),
                                             y.cast(pa.float64(), safe=False)))
            return AVal(pc.if_else(pc.greater_equal(y, 0), p, pa.scalar(None, pa.int64())), LONG)
        return AVal(_long_arith(op, x, y), LONG)
    return AVal(_double_arith(op, x, y), DOUBLE)


def negate(arg: AVal) -> AVal:
    """Unary ``-``: LONG (overflow: null) or DOUBLE."""
    if arg.type in (LONG, BOOL):
        n = len(arg.arr)
        return AVal(_long_arith("-", pa.array(np.zeros(n, np.int64)), as_long(arg)), LONG)
    return AVal(pc.negate(as_double(arg)), DOUBLE)

