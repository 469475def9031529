"""Druid expressions and filters as Spark SQL Columns (evaluated in the JVM, never per row in Python).

Every translated value has a static Druid type: ``LONG``, ``DOUBLE``, ``STRING``, or
``BOOL`` (a Spark boolean standing for Druid's strict-boolean LONG 1/0). Input fields take
their type from the input: Parquet integers (and timestamps/dates, as epoch millis) are
LONG, floating point and decimals DOUBLE, everything else STRING; JSON and CSV fields are
read as text, so they are STRINGs (as Druid's CSV reader gives them). Druid's coercions
(``ExpressionTypeConversion``) then decide: an operator on two STRINGs is a string operator
(``+`` concatenates), otherwise STRINGs are parsed as numbers (null if not numeric) and the
arithmetic is LONG only when both sides are LONG. Null handling is Druid's SQL-compatible
mode (the default since Druid 28): null in, null out; ``&&``/``||`` are three-valued.

Spark runs with ANSI mode on: every operation that could raise on a row (casts, division,
overflow) uses a ``try_`` form or a guard, so a bad value is null, never a failed task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shuffled.spark.spec.base import SpecError
from shuffled.spark.spec.expr import (BOOL, DOUBLE, LONG, NULL, STRING,
                                      Binary, Call, Ident, Lit, Node, Unary, branch_type)
from shuffled.spark.spec.granularity import MONDAY_OFFSET, WEEK
from shuffled.spark.spec.patterns import joda_to_spark, like_to_regex, parse_period, period_millis


_ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


@dataclass(frozen=True)
class Val:
    """A translated value: the Column and its static Druid type."""

    col: Column
    type: str


def druid_type(dtype: T.DataType) -> str | None:
    """The Druid type an input column of Spark type ``dtype`` has in expressions."""
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return LONG
    if isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return DOUBLE
    if isinstance(dtype, (T.StringType, T.BooleanType)):
        return STRING
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType, T.DateType)):
        return LONG
    return None


def input_val(col: Column, dtype: T.DataType, name: str, path: str) -> Val:
    kind = druid_type(dtype)
    if kind is None:
        raise SpecError(path, f"column {name!r} of type {dtype.simpleString()} cannot be used in an expression")
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType, T.DateType)):
        return Val(F.unix_millis(col.cast("timestamp")), LONG)
    if isinstance(dtype, T.BooleanType):
        return Val(col.cast("string"), STRING)
    if isinstance(dtype, (T.FloatType, T.DecimalType)):
        return Val(col.cast("double"), DOUBLE)
    if kind == LONG:
        return Val(col.cast("bigint"), LONG)
    return Val(col, kind)


# --- coercions -------------------------------------------------------------------------

def as_double(v: Val) -> Column:
    if v.type == STRING:
        return v.col.try_cast("double")
    return v.col.cast("double") if v.type != NULL else F.lit(None).cast("double")


def as_long(v: Val) -> Column:
    """Druid's ``asLong``: a long as is, else the number truncated toward zero."""
    if v.type in (LONG, BOOL):
        return v.col.cast("bigint")
    if v.type == DOUBLE:
        return v.col.try_cast("bigint")
    if v.type == NULL:
        return F.lit(None).cast("bigint")
    return F.coalesce(v.col.try_cast("bigint"), v.col.try_cast("double").try_cast("bigint"))


def as_string(v: Val) -> Column:
    if v.type == STRING:
        return v.col
    if v.type == BOOL:
        return v.col.cast("bigint").cast("string")
    return v.col.cast("string")


def as_bool(v: Val) -> Column:
    """Druid's truthiness: numbers > 0; strings equal to 'true' ignoring case."""
    if v.type == BOOL:
        return v.col
    if v.type == STRING:
        return F.lower(v.col) == F.lit("true")
    if v.type == NULL:
        return F.lit(None).cast("boolean")
    return v.col > F.lit(0)


def as_value(v: Val) -> Val:
    """What a transform outputs: BOOL becomes LONG 1/0, NULL a null string."""
    if v.type == BOOL:
        return Val(v.col.cast("bigint"), LONG)
    if v.type == NULL:
        return Val(F.lit(None).cast("string"), STRING)
    return v


def _numeric_type(a: Val, b: Val) -> str:
    return LONG if a.type in (LONG, BOOL, NULL) and b.type in (LONG, BOOL, NULL) else DOUBLE


def _num(v: Val, kind: str) -> Column:
    return as_long(v) if kind == LONG else as_double(v)


def common(vals: list[Val]) -> tuple[str, list[Column]]:
    """One type for the branches of if/case/nvl: equal types stay, numbers widen to DOUBLE,
    anything mixed with a STRING is a STRING."""
    kind = branch_type({v.type for v in vals})
    conv = {BOOL: lambda v: as_bool(v), LONG: as_long, DOUBLE: as_double, STRING: as_string}[kind]
    return kind, [conv(v) for v in vals]


# --- expressions -----------------------------------------------------------------------

class Translator:
    """Translates expression ASTs over a row whose columns are ``columns`` (name -> Val)."""

    def __init__(self, columns: dict[str, Val], path: str) -> None:
        self.columns = columns
        self.path = path

    def __call__(self, node: Node) -> Val:
        if isinstance(node, Lit):
            return _lit(node.value)
        if isinstance(node, Ident):
            got = self.columns.get(node.name)
            return got if got is not None else Val(F.lit(None).cast("string"), NULL)
        if isinstance(node, Unary):
            arg = self(node.arg)
            if node.op == "!":
                return Val(~as_bool(arg), BOOL)
            if arg.type in (LONG, BOOL):
                return Val(F.try_subtract(F.lit(0).cast("bigint"), as_long(arg)), LONG)
            return Val(-as_double(arg), DOUBLE)
        if isinstance(node, Binary):
            return self.binary(node.op, self(node.left), self(node.right))
        assert isinstance(node, Call)
        return getattr(self, f"fn_{node.fn}")(node)

    def binary(self, op: str, a: Val, b: Val) -> Val:
        if op in ("&&", "||"):
            x, y = as_bool(a), as_bool(b)
            return Val(x & y if op == "&&" else x | y, BOOL)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            if a.type == STRING and b.type == STRING:
                x, y = a.col, b.col
            else:
                kind = _numeric_type(a, b)
                x, y = _num(a, kind), _num(b, kind)
            cmp = {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y, "!=": x != y}
            return Val(cmp[op], BOOL)
        if op == "+" and a.type == STRING and b.type == STRING:
            return Val(F.concat(a.col, b.col), STRING)
        kind = _numeric_type(a, b)
        x, y = _num(a, kind), _num(b, kind)
        if kind == LONG:
            if op == "+":
                return Val(F.try_add(x, y), LONG)
            if op == "-":
                return Val(F.try_subtract(x, y), LONG)
            if op == "*":
                return Val(F.try_multiply(x, y), LONG)
            if op == "/":  # Java's long division; MIN / -1 wraps to MIN as in Java
                wraps = (y == -1) & (x == F.lit(-(2**63)).cast("bigint"))
                return Val(F.when(wraps, x).when(y != 0, F.call_function("div", x, y)), LONG)
            if op == "%":
                return Val(F.when(y != 0, x % y), LONG)
            return Val(F.when(y >= 0, F.pow(x, y).try_cast("bigint")), LONG)
        if op == "+":
            return Val(x + y, DOUBLE)
        if op == "-":
            return Val(x - y, DOUBLE)
        if op == "*":
            return Val(x * y, DOUBLE)
        if op == "/":  # Java's double division: +-Infinity or NaN by zero
            by_zero = F.when(x > 0, F.lit(float("inf"))).when(x < 0, F.lit(float("-inf"))) \
                .when(x.isNotNull(), F.lit(float("nan")))
            return Val(F.when(y == 0, by_zero).otherwise(F.try_divide(x, y)), DOUBLE)
        if op == "%":
            return Val(F.when(y == 0, F.when(x.isNotNull(), F.lit(float("nan")))).otherwise(x % y), DOUBLE)
        return Val(F.pow(x, y), DOUBLE)

    # Functions: one method per entry of spec.expr.FUNCTIONS.

    def fn_concat(self, n: Call) -> Val:
        return Val(F.concat(*[as_string(self(a)) for a in n.args]), STRING)

    def fn_substring(self, n: Call) -> Val:
        s = as_string(self(n.args[0]))
        idx, length = as_long(self(n.args[1])), as_long(self(n.args[2]))
        size = F.length(s)
        out = s.substr(idx + 1, F.when(length >= 0, length).otherwise(size))
        return Val(F.when((idx >= 0) & (idx < size), out), STRING)

    def fn_lower(self, n: Call) -> Val:
        return Val(F.lower(as_string(self(n.args[0]))), STRING)

    def fn_upper(self, n: Call) -> Val:
        return Val(F.upper(as_string(self(n.args[0]))), STRING)

    def fn_strlen(self, n: Call) -> Val:
        return Val(F.length(as_string(self(n.args[0]))).cast("bigint"), LONG)

    def fn_trim(self, n: Call) -> Val:
        return Val(F.trim(as_string(self(n.args[0]))), STRING)

    def fn_replace(self, n: Call) -> Val:
        s, old, new = (as_string(self(a)) for a in n.args)
        return Val(F.replace(s, old, new), STRING)

    def fn_nvl(self, n: Call) -> Val:
        kind, cols = common([self(a) for a in n.args])
        return Val(F.coalesce(*cols), kind)

    def fn_isnull(self, n: Call) -> Val:
        return Val(self(n.args[0]).col.isNull(), BOOL)

    def fn_notnull(self, n: Call) -> Val:
        return Val(self(n.args[0]).col.isNotNull(), BOOL)

    def fn_abs(self, n: Call) -> Val:
        v = self(n.args[0])
        kind = LONG if v.type in (LONG, BOOL) else DOUBLE
        x = _num(v, kind)
        if kind == LONG:  # abs(MIN) overflows (ANSI: the job would fail): null
            return Val(F.when(x != F.lit(-(2 ** 63)).cast("bigint"), F.abs(x)), LONG)
        return Val(F.abs(x), kind)

    def fn_if(self, n: Call) -> Val:
        kind, (then, other) = common([self(n.args[1]), self(n.args[2])])
        return Val(F.when(as_bool(self(n.args[0])), then).otherwise(other), kind)

    def _cases(self, conds: list[Column], values: list[Val], default: Val | None) -> Val:
        kind, cols = common(values + ([default] if default else []))
        out = F.when(conds[0], cols[0])
        for c, v in zip(conds[1:], cols[1:len(conds)]):
            out = out.when(c, v)
        return Val(out.otherwise(cols[-1]) if default else out, kind)

    def fn_case_searched(self, n: Call) -> Val:
        args = list(n.args)
        default = self(args.pop()) if len(args) % 2 else None
        conds = [as_bool(self(a)) for a in args[0::2]]
        return self._cases(conds, [self(a) for a in args[1::2]], default)

    def fn_case_simple(self, n: Call) -> Val:
        subject, args = n.args[0], list(n.args[1:])
        default = self(args.pop()) if len(args) % 2 else None
        x = self(subject)
        conds = [self.binary("==", x, self(a)).col for a in args[0::2]]
        return self._cases(conds, [self(a) for a in args[1::2]], default)

    def fn_like(self, n: Call) -> Val:
        pattern, escape = _lits(n)[1], (_lits(n) + [None])[2]
        return Val(as_string(self(n.args[0])).rlike(like_to_regex(pattern, escape)), BOOL)

    def fn_regexp_like(self, n: Call) -> Val:
        return Val(as_string(self(n.args[0])).rlike(str(_lits(n)[1])), BOOL)

    def fn_regexp_extract(self, n: Call) -> Val:
        s = as_string(self(n.args[0]))
        lits = _lits(n)
        pattern, group = str(lits[1]), int(cast(int, lits[2])) if len(lits) > 2 else 0
        # Druid: the group of the first match, null when nothing matches.
        return Val(F.when(s.rlike(pattern), F.regexp_extract(s, pattern, group)), STRING)

    def fn_timestamp_floor(self, n: Call) -> Val:
        t = as_long(self(n.args[0]))
        lits = _lits(n) + [None, None]
        unit, count = parse_period(lits[1])
        origin = lits[2]
        fixed = period_millis(unit, count)
        if fixed is not None:
            if unit == "week" and count == 1 and origin is None:
                return Val(t - F.pmod(t - F.lit(MONDAY_OFFSET), F.lit(WEEK)), LONG)
            base = F.lit(int(origin or 0))
            return Val(t - F.pmod(t - base, F.lit(fixed)), LONG)
        months = count * (12 if unit == "year" else 1)
        ts = F.timestamp_millis(t)
        m = (F.year(ts) - 1970) * 12 + F.month(ts) - 1
        start = F.add_months(F.lit("1970-01-01").cast("date"), (m - F.pmod(m, F.lit(months))).cast("int"))
        return Val(F.unix_millis(start.cast("timestamp")), LONG)

    def fn_timestamp_parse(self, n: Call) -> Val:
        s = as_string(self(n.args[0]))
        lits = _lits(n) + [None]
        if lits[1] is None:
            ts = s.try_cast("timestamp")
        else:
            ts = F.try_to_timestamp(s, F.lit(joda_to_spark(lits[1])))
        return Val(F.unix_millis(ts), LONG)

    def fn_timestamp_format(self, n: Call) -> Val:
        t = as_long(self(n.args[0]))
        lits = _lits(n) + [None]
        pattern = _ISO if lits[1] is None else joda_to_spark(lits[1])
        return Val(F.date_format(F.timestamp_millis(t), pattern), STRING)

    def fn_cast(self, n: Call) -> Val:
        v = self(n.args[0])
        kind = str(_lits(n)[1]).upper()
        if kind == "LONG":
            return Val(as_long(v), LONG)
        if kind in ("DOUBLE", "FLOAT"):
            return Val(as_double(v), DOUBLE)
        return Val(as_string(v), STRING)


def _lits(n: Call) -> list[int | float | str | None]:
    return [a.value if isinstance(a, Lit) else None for a in n.args]


def _lit(value: int | float | str | None) -> Val:
    if value is None:
        return Val(F.lit(None).cast("string"), NULL)
    if isinstance(value, int):
        return Val(F.lit(value).cast("bigint"), LONG)
    if isinstance(value, float):
        return Val(F.lit(value).cast("double"), DOUBLE)
    return Val(F.lit(value), STRING)
