"""What the JVM reader makes of a JSON or CSV value, computed on the Arrow array pyarrow read.

The JVM path reads every field as text (``from_json``/``from_csv``) and types it with Spark
SQL (:func:`shuffled.spark.phase1.jvm.prepare._typed`, :func:`shuffled.spark.phase1.jvm.prepare._timestamp`). pyarrow.json gives a field the
type of its JSON values instead: ``string``, ``int64``, ``float64``, ``bool``, ``null``. For
each, the functions here give what the JVM computes from the text Spark would have made of
that value (an integer's digits, ``true``/``false``), so both readers agree value for value.

A field pyarrow had to read as ``float64`` (a decimal among its values) holds integers as
floats too; where the text matters (a string dimension, a transform's input, an ``auto`` or
``iso`` timestamp) ``12`` and ``12.0`` would differ, so that raises :class:`.Declined`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.phase1.spark_compat.casts import floor_long, to_double, to_float, to_long, trim_spaces
from shuffled.spark.phase1.spark_compat.java_text import java_double, java_double_text
from shuffled.spark.phase1.spark_compat.timestamps import to_micros
from shuffled.spark.phase1.native.text.blocks import Declined

_SCALE = {"posix": 1000.0, "micro": 0.001, "nano": 0.000001}
_ARROW = {"long": pa.int64(), "double": pa.float64(), "float": pa.float32(), "string": pa.string()}


def plain(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array, dictionaries decoded."""
    a = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
    return a.cast(a.type.value_type) if pa.types.is_dictionary(a.type) else a


def _no_special(a: pa.Array, where: str) -> None:
    if pa.types.is_floating(a.type) and len(a):
        values = a.to_numpy(zero_copy_only=False)
        if not np.isfinite(values[~np.isnan(values)] if a.null_count else values).all() or (
                a.null_count == 0 and np.isnan(values).any()):
            raise Declined(f"NaN or Infinity in {where} (Spark reads it as quoted text)")


#: Integral float64 values whose text is looked up in their lines, at most, per piece.
RESOLVE_LIMIT = 256
Resolve = Callable[[np.ndarray], list[str]]


def text_of(a: pa.Array, where: str, resolve: Resolve | None = None) -> pa.Array:
    """The text Spark's ``from_json`` gives a value (strings as they are, integers' digits,
    ``true``/``false``); ``where`` names the field if that cannot be known. ``resolve``
    gives the JSON text of the given rows' values from their lines."""
    a = plain(a)
    t = a.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return a.cast(pa.string())
    if pa.types.is_null(t):
        return pa.nulls(len(a), pa.string())
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return a.cast(pa.string())
    if pa.types.is_floating(t):
        # Read as float64, an integer token (Spark: its digits) and an integral decimal
        # (Spark: Java's text of the double) look alike; other values are decimals.
        _no_special(a, where)
        values = a.to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            integral = np.flatnonzero(np.floor(values) == values)
        out = java_double_text(a)
        if not len(integral):
            return out
        if resolve is None or len(integral) > max(RESOLVE_LIMIT, len(a) // 100):
            raise Declined(f"{where}: integral numbers among decimals, where their text is used")
        mask = np.zeros(len(a), dtype=bool)
        mask[integral] = True
        return pc.replace_with_mask(out, pa.array(mask), pa.array(resolve(integral), pa.string()))
    raise Declined(f"{where}: a JSON {t} where its text is used")


def typed(a: pa.Array, kind: str, where: str, resolve: Resolve | None = None,
          ) -> tuple[pa.Array, np.ndarray]:
    """The value as ``kind`` (long, double, float, string) and whether the row is
    unparseable (text that is not a number), as :func:`shuffled.spark.phase1.jvm.prepare._typed` for text input."""
    a = plain(a)
    t = a.type
    if kind == "string":
        return text_of(a, where, resolve), np.zeros(len(a), dtype=bool)
    if pa.types.is_integer(t):  # the digits parse back to the same integer
        return a.cast(_ARROW[kind], safe=False), np.zeros(len(a), dtype=bool)
    if pa.types.is_floating(t):
        _no_special(a, where)
        if kind == "long":
            value = floor_long(a)
            return value, (pc.is_valid(a).to_numpy(zero_copy_only=False)
                           & ~pc.is_valid(value).to_numpy(zero_copy_only=False))
        return a.cast(_ARROW[kind], safe=False), np.zeros(len(a), dtype=bool)
    text = pc.if_else(pc.equal(trim_spaces(text_of(a, where)), ""), pa.scalar(None, pa.string()),
                      trim_spaces(text_of(a, where)))
    if kind == "long":
        value = pc.coalesce(to_long(text), floor_long(to_double(text)))
    elif kind == "double":
        value = to_double(text)
    else:
        value = to_float(text)
    bad = pc.and_(pc.is_valid(text), pc.is_null(value))
    return value, bad.to_numpy(zero_copy_only=False)


def timestamp_millis(a: pa.Array, fmt: str, where: str) -> pa.Array:
    """Epoch millis as :func:`shuffled.spark.phase1.jvm.prepare._timestamp` computes them from text (null: unparseable)."""
    a = plain(a)
    t = a.type
    scale = _SCALE.get(fmt)
    if pa.types.is_floating(t):
        _no_special(a, where)
        if scale is not None:
            return floor_long(pc.multiply(a.cast(pa.float64()), scale))
        if fmt == "millis":
            return floor_long(a)
        raise Declined(f"{where}: decimal numbers among the timestamps, read as {fmt}")
    if pa.types.is_integer(t) and fmt != "iso":
        if scale is not None:
            return floor_long(pc.multiply(a.cast(pa.float64()), scale))
        return a.cast(pa.int64())
    c = trim_spaces(text_of(a, where))
    if scale is not None:
        return floor_long(pc.multiply(to_double(c), scale))
    if fmt == "millis":
        return pc.coalesce(to_long(c), floor_long(to_double(c)))
    iso = _floor_div(to_micros(c), 1000)  # unix_millis: floorDiv of the micros
    if fmt == "iso":
        return iso
    # auto: digits are millis, anything else ISO. Only text ISO did not parse, or short
    # enough to be a year of digits, is looked at again (all-ISO input pays nothing more).
    rest = pc.and_(pc.or_(pc.is_null(iso), pc.less_equal(pc.utf8_length(c), 7)), pc.is_valid(c))
    if not pc.any(rest).as_py():
        return iso
    integer = pc.and_(rest, pc.fill_null(pc.match_substring_regex(c, r"^-?[0-9]+$"), False))
    if not pc.any(integer).as_py():
        return iso
    digits = pc.if_else(integer, c, pa.scalar(None, pa.string()))
    return pc.if_else(integer, pc.coalesce(to_long(digits), floor_long(to_double(digits))), iso)


def _floor_div(a: pa.Array, d: int) -> pa.Array:
    values = a.fill_null(0).to_numpy(zero_copy_only=False)
    return pa.array(np.floor_divide(values, d), pa.int64(), mask=~pc.is_valid(a).to_numpy(
        zero_copy_only=False))


def shown(a: pa.Array, i: int) -> str:
    """The text the JVM shows for value ``i`` in a message (``null`` for null)."""
    v = a[i].as_py()
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return java_double(v)
    return str(v)
