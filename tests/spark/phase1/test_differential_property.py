"""The two halves of Druid's semantics agree on generated rows and expressions (issue 38).

The JVM side (:mod:`shuffled.spark.phase1.jvm.sqlexpr`: Druid expressions as Spark SQL)
and the Arrow side (:mod:`shuffled.spark.phase1.arrow_expr`) must compute the same value
for every row. test_native_transforms checks a fixed list of expressions on fixed rows;
here hypothesis builds the rows (extreme longs, NaN, infinities, -0.0, numbers as text,
nulls) and the expressions (operators, comparisons, logic and functions nested a few
deep), and every example is one Spark job evaluating all of its expressions at once.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shuffled.spark.phase1.arrow_expr.transform import ArrowTranslator
from shuffled.spark.phase1.arrow_expr.values import DOUBLE, LONG, STRING, AVal, as_value
from shuffled.spark.spec.expr import parse_expr
from tests.helpers.ingestion import spark  # noqa: F401

pytestmark = pytest.mark.spark

LONGS = st.one_of(st.integers(-1000, 1000), st.sampled_from(
    [0, 1, -1, 2 ** 31, -(2 ** 31), 2 ** 62, 9223372036854775807, -9223372036854775808]))
DOUBLES = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from(
    [0.0, -0.0, 0.5, -2.5, math.nan, math.inf, -math.inf, 1e300]))
TEXTS = st.sampled_from(["", "abc", "12", "-4", "3.5", " 7 ", "NaN", "1e3", "x%y", "É"])
ROWS = st.lists(st.tuples(st.none() | LONGS, st.none() | DOUBLES, st.none() | TEXTS,
                          st.none() | TEXTS), min_size=1, max_size=12)

LEAVES = st.sampled_from(["n", "d", "s", "t", "1", "0", "-3", "2.5", "'ab'", "'12'", "null"])
NUMERIC_LEAVES = st.sampled_from(["n", "d", "t", "1", "-3", "2.5", "0"])


def _expressions(depth: int) -> st.SearchStrategy[str]:
    if depth == 0:
        return LEAVES
    inner = _expressions(depth - 1)
    numeric = st.one_of(NUMERIC_LEAVES, inner)
    return st.one_of(
        LEAVES,
        st.builds("({} {} {})".format, numeric, st.sampled_from(["+", "-", "*", "/", "%"]),
                  numeric),
        st.builds("({} {} {})".format, inner,
                  st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), inner),
        st.builds("({} {} {})".format, inner, st.sampled_from(["&&", "||"]), inner),
        st.builds("!{}".format, inner),
        st.builds("abs({})".format, numeric),
        st.builds("nvl({}, {})".format, inner, inner),
        st.builds("if({}, {}, {})".format, inner, inner, inner),
        st.builds("concat({}, {})".format, inner, inner),
        st.builds("strlen({})".format, inner),
        st.builds("upper({})".format, inner),
        st.builds("cast({}, '{}')".format, inner, st.sampled_from(["LONG", "DOUBLE", "STRING"])),
    )


EXPRESSIONS = st.lists(_expressions(2), min_size=1, max_size=8)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, str) and isinstance(b, str) and a != b and _jdk_digits(a, b):
        return True
    return a == b and type(a) is type(b)


def _jdk_digits(jvm: str, ours: str) -> bool:
    """A double printed by Java 17 with one digit more than the shortest that reads back
    to it (JDK-4511638, fixed in JDK 19: 2^62 prints as 4.6116860184273879E18 there, as
    4.611686018427388E18 here and from Java 19 on), the same double either way."""
    try:
        same = float(jvm) == float(ours)
    except ValueError:
        return False
    return same and "E" in jvm.upper() and len(jvm) == len(ours) + 1


def _significant(text: str) -> str:
    """The digits of a printed double's mantissa, without sign, point, leading zeros or
    the ``.0`` both Java and Python end a whole mantissa with."""
    mantissa = text.upper().split("E")[0].lstrip("-").removesuffix(".0")
    return mantissa.replace(".", "").lstrip("0")


def _extra_digit(jvm: str | None) -> bool:
    """Whether the JVM printed this double with more significant digits than the shortest
    text that reads back to it (Python's repr), as Java 17 does for some (JDK-4511638)."""
    if jvm is None:
        return False
    try:
        value = float(jvm)
    except ValueError:
        return False
    if not math.isfinite(value):
        return False
    return len(_significant(jvm)) > len(_significant(repr(value)))


def test_the_extra_digit_is_found_where_java_17_prints_it() -> None:
    assert _extra_digit("4.6116860184273879E18")  # 2^62 on Java 17
    assert not _extra_digit("4.611686018427388E18")
    assert _extra_digit("0.0020")  # 2e-3 on Java 17
    for same in ("1.0E10", "1.0E-5", "-2.5", "0.0", "100.0", "0.002", "1.0E23"):
        assert not _extra_digit(same), same
    assert not _extra_digit(None) and not _extra_digit("NaN") and not _extra_digit("Infinity")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(rows=ROWS, exprs=EXPRESSIONS)
def test_jvm_and_arrow_compute_the_same_values(spark: Any, rows: list[tuple[Any, ...]],
                                               exprs: list[str]) -> None:
    from pyspark.sql import functions as F

    from shuffled.spark.driver.sparksession import job_conf
    from shuffled.spark.phase1.jvm.sqlexpr import Translator, as_value as spark_value, input_val
    from shuffled.spark.spec.parse import SpecError

    def parses(expr: str) -> bool:  # the grammar may build what Druid's parser refuses
        try:
            parse_expr(expr, "$")
        except SpecError:
            return False
        return True

    exprs = [e for e in exprs if parses(e)]
    assume(exprs)
    frame = spark.createDataFrame([(i, *r) for i, r in enumerate(rows)],
                                  "id bigint, n bigint, d double, s string, t string")
    columns = {f.name: input_val(F.col(f.name), f.dataType, f.name, "$")
               for f in frame.schema.fields}
    translate = Translator(columns, "$")
    cols = [spark_value(translate(parse_expr(e, "$"))).col.alias(f"c{i}")
            for i, e in enumerate(exprs)]
    # Each row's n (as a double) and d printed by the JVM: a row where Java 17 prints one
    # more digit than the shortest (_jdk_digits) may differ through any expression that
    # measures or cuts that text (strlen(nvl(n, d)) of n = 2^62: 21 against 20).
    printed = [F.col("n").cast("double").cast("string"), F.col("d").cast("string")]
    with job_conf(spark):
        got_rows = frame.orderBy("id").select(*cols, *printed).collect()
    want = [tuple(r)[:len(cols)] for r in got_rows]
    jdk = {row for row, r in enumerate(got_rows)
           if any(_extra_digit(t) for t in tuple(r)[len(cols):])}
    arrays = {"n": AVal(pa.array([r[0] for r in rows], pa.int64()), LONG),
              "d": AVal(pa.array([r[1] for r in rows], pa.float64()), DOUBLE),
              "s": AVal(pa.array([r[2] for r in rows], pa.string()), STRING),
              "t": AVal(pa.array([r[3] for r in rows], pa.string()), STRING)}
    arrow = ArrowTranslator(arrays, len(rows))
    got = [as_value(arrow(parse_expr(e, "$"))).arr.to_pylist() for e in exprs]
    wrong = [(e, row, want[row][i], got[i][row]) for i, e in enumerate(exprs)
             for row in range(len(rows))
             if row not in jdk and not _same(want[row][i], got[i][row])]
    assert not wrong, wrong[:8]
