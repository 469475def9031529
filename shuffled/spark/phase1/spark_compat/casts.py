"""Spark's casts of text to numbers, on Arrow: what ``try_cast`` gives in the JVM path.

The JVM path reads every JSON and CSV field as text and types it with Spark SQL
(:mod:`shuffled.spark.phase1.jvm.prepare`); the native text reader must give the same values, so each function here
is one Spark cast (Spark 4, ANSI on, ``try_cast``: null where the text is not a number),
computed on whole Arrow arrays:

- ``bigint``: ``UTF8String.toLongExact``: whitespace and ISO control characters trimmed,
  an optional sign and decimal digits (leading zeros allowed), null on overflow;
- ``double``/``float``: Java's ``Double.parseDouble``/``Float.parseFloat`` (characters up to
  U+0020 trimmed, ``1.``, ``.5``, exponents, a ``d``/``f`` suffix, hexadecimal ``0x1p3``,
  ``NaN``/``Infinity``) plus Spark's ``inf``/``infinity``/``nan`` in any case.

Only text that passed a vectorised grammar check is handed to Arrow's cast (which would
fail the whole array on one bad value); hexadecimal floats, which nobody writes but Java
reads, are converted per distinct value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Java's ``String.trim`` (Double.parseDouble): every character up to U+0020.
JAVA_TRIM = "".join(chr(c) for c in range(0x21))
#: ``UTF8String.isWhitespaceOrISOControl`` on bytes: the same plus DEL.
SPARK_TRIM = JAVA_TRIM + "\x7f"
_LONG = r"^[+-]?[0-9]+$"
_DECIMAL = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_HEX = r"^[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+$"
_MAX = "9223372036854775807"
_TWO63 = 2.0 ** 63


def _strings(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    a = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
    return a if a.type == pa.string() else a.cast(pa.string())


def _where(mask: pa.Array, values: pa.Array, typ: pa.DataType) -> pa.Array:
    return pc.if_else(mask, values, pa.scalar(None, typ))


def to_long(text: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``try_cast(text AS BIGINT)``."""
    s = pc.utf8_trim(_strings(text), SPARK_TRIM)
    ok = pc.fill_null(pc.match_substring_regex(s, _LONG), False)
    if not pc.any(ok).as_py():
        return pa.nulls(len(s), pa.int64())
    # Leading zeros dropped, then up to 18 digits always fit; 19 fit up to 2^63 - 1 (the
    # negative side one more); longer never does.
    body = pc.replace_substring_regex(s, r"^\+?(-?)0*([0-9])", r"\1\2")
    digits = pc.utf8_length(pc.replace_substring_regex(body, r"^[+-]", ""))
    negative = pc.starts_with(body, "-")
    bare = pc.replace_substring_regex(body, r"^[+-]", "")
    limit = pc.if_else(negative, "9223372036854775808", _MAX)
    fits = pc.or_(pc.less(digits, 19), pc.and_(pc.equal(digits, 19),
                                               pc.less_equal(bare, limit)))
    ok = pc.and_(ok, fits)
    # -2^63 has no positive counterpart: cast its digits through a wider route.
    low = pc.and_(ok, pc.equal(body, "-9223372036854775808"))
    safe = pc.and_(ok, pc.invert(low))
    cast = pc.cast(_where(safe, body, pa.string()), pa.int64())
    return pc.if_else(low, pa.scalar(-(2 ** 63), pa.int64()), cast)


def _java_number(text: pa.Array | pa.ChunkedArray, typ: pa.DataType) -> pa.Array:
    """Java's parseDouble/parseFloat with Spark's special literals; null if not a number."""
    s = pc.utf8_trim(_strings(text), JAVA_TRIM)
    lower = pc.utf8_lower(s)
    special = {"inf": "inf", "+inf": "inf", "infinity": "inf", "+infinity": "inf",
               "-inf": "-inf", "-infinity": "-inf", "nan": "nan"}
    java = {"NaN": "nan", "+NaN": "nan", "-NaN": "nan", "Infinity": "inf",
            "+Infinity": "inf", "-Infinity": "-inf"}
    # A 'd'/'f' suffix (Java) is allowed after a decimal or hexadecimal number, not after a
    # special literal.
    unsuffixed = pc.replace_substring_regex(s, r"(?i)([0-9.])[df]$", r"\1")
    decimal = pc.fill_null(pc.match_substring_regex(unsuffixed, _DECIMAL), False)
    out = pc.cast(_where(decimal, unsuffixed, pa.string()), typ)
    for table, source in ((special, lower), (java, s)):
        keys = pa.array(list(table))
        hit = pc.index_in(source, keys)
        if pc.any(pc.is_valid(hit)).as_py():
            vals = pa.array([float(table[k]) for k in table], typ)
            out = pc.coalesce(out, pc.take(vals, hit))
    hexa = pc.fill_null(pc.match_substring_regex(unsuffixed, _HEX), False)
    if pc.any(hexa).as_py():
        found = pc.unique(unsuffixed.filter(hexa))
        vals = pa.array([float.fromhex(v) for v in found.to_pylist()], pa.float64()).cast(
            typ, safe=False)
        out = pc.coalesce(out, pc.take(vals, pc.index_in(unsuffixed, found)))
    return out


def to_double(text: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``try_cast(text AS DOUBLE)``."""
    return _java_number(text, pa.float64())


def to_float(text: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``try_cast(text AS FLOAT)``."""
    return _java_number(text, pa.float32())


def floor_long(d: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``floor(d)`` as a BIGINT, null where it does not fit (NaN, infinities, beyond 2^63)."""
    values = d.combine_chunks() if isinstance(d, pa.ChunkedArray) else d
    x = values.to_numpy(zero_copy_only=False).astype(np.float64)
    with np.errstate(invalid="ignore"):
        fits = (x >= -_TWO63) & (x < _TWO63)
    valid = fits & pc.is_valid(values).to_numpy(zero_copy_only=False)
    out = np.floor(np.where(valid, x, 0.0)).astype(np.int64)
    return pa.array(out, pa.int64(), mask=~valid)


def trim_spaces(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Spark SQL's ``trim(s)``: spaces (U+0020 only) at both ends."""
    return pc.utf8_trim(_strings(a), " ")
