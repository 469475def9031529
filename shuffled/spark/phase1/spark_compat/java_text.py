"""Java's ``Double.toString`` on Arrow: the text Spark's cast of a double to a string
gives (the JVM path's answer), for the native path and the Arrow expressions alike."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc


def java_double(x: float) -> str:
    """Java's ``Double.toString`` (shortest digits; JDK 17 prints a few values with one
    digit more, which only a message could show)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    digits, exp = _shortest(abs(x))
    if 1e-3 <= abs(x) < 1e7:
        point = exp + 1
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole, frac = digits[:point].ljust(point, "0"), digits[point:]
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exp}"


def java_double_text(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """:func:`java_double` of every value (per distinct value: such columns are small)."""
    a = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
    if pa.types.is_dictionary(a.type):
        a = a.cast(a.type.value_type)
    a = a.cast(pa.float64())
    distinct = pc.unique(a.drop_null())
    texts = pa.array([java_double(v) for v in distinct.to_pylist()], pa.string())
    return pc.take(texts, pc.index_in(a, distinct))


def _shortest(x: float) -> tuple[str, int]:
    """Shortest round-trip digits of ``x`` > 0 and the decimal exponent of the first."""
    text = repr(x)
    if "e" in text:
        mantissa, _, exp = text.partition("e")
        return mantissa.replace(".", "").rstrip("0") or "0", int(exp)
    whole, _, frac = text.partition(".")
    digits = (whole + frac).lstrip("0").rstrip("0") or "0"
    if whole.strip("0"):
        return digits, len(whole.lstrip("0")) - 1
    return digits, -(len(frac) - len(frac.lstrip("0")) + 1)
