"""Multi-value string dimensions on the JVM side: arrays in the input become one string per
row in :mod:`shuffled.spark.rows.multivalue`'s form, as Spark SQL expressions.

Which input columns can hold arrays: a JSON string dimension is parsed as a VARIANT (so a
JSON array ``["a"]`` and the JSON string ``"[\\"a\\"]"`` stay apart, see
:func:`variant_fields`), and a Parquet ``list`` column arrives as a Spark ARRAY.
``multiValueHandling`` is applied here: ``SORTED_ARRAY`` (Druid's default) sorts the values,
nulls first, keeping duplicates; ``SORTED_SET`` also drops duplicates; ``ARRAY`` keeps them as
they come. Sorting is by UTF-8 bytes (Druid sorts Java strings: UTF-16 units; they differ
only for characters beyond the Basic Multilingual Plane).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shuffled.spark.rows.multivalue import ITEM, SEP
from shuffled.spark.spec.model import IngestSpec

def variant_fields(spec: IngestSpec) -> set[str]:
    """JSON input fields read as VARIANT: string dimensions read straight from the input
    (no transform produces them, and nothing else reads the field as text)."""
    if spec.input_format.type != "json":
        return set()
    produced = {t.name for t in spec.transform.transforms}
    others = set(spec.transform.reads) | {m.field for m in spec.metrics if m.field}
    flat = spec.input_format.flatten
    out = set()
    for d in spec.dimensions:
        found = flat.get(d.name)
        root = found is None or (len(found.steps) == 1 and found.steps[0] == d.name)
        if d.type == "string" and root and d.name not in produced and d.name not in others:
            out.add(d.name)
    return out


def can_hold_arrays(dtype: T.DataType) -> bool:
    """Whether a prepared input column of this type may carry multi-values."""
    return isinstance(dtype, (T.VariantType, T.ArrayType))


def _handled(arr: Column, handling: str) -> Column:
    if handling == "SORTED_SET":
        return F.sort_array(F.array_distinct(arr), asc=True)
    if handling == "SORTED_ARRAY":
        return F.sort_array(arr, asc=True)  # nulls first
    return arr


def encode(arr: Column, handling: str) -> Column:
    """An ARRAY<STRING> column in the one-string form, after ``handling``."""
    a = _handled(arr, handling)
    joined = F.array_join(F.transform(a, lambda x: F.coalesce(F.concat(F.lit(ITEM), x), F.lit(""))),
                          SEP)
    return (F.when(F.size(a) == 0, F.lit(None).cast("string"))
            .when(F.size(a) == 1, F.element_at(a, 1))
            .otherwise(joined))


def string_dimension(c: Column, dtype: T.DataType, name: str, handling: str,
                     single: bool) -> tuple[Column, Column | None]:
    """A string dimension read from a column that may hold arrays: its value and a
    'cannot ingest' reason (U+0000 in a value; more than one value where ``single``, i.e.
    a range partition dimension, which Druid also requires single-valued)."""
    if isinstance(dtype, T.VariantType):
        arr = F.try_variant_get(c, "$", "array<string>")
        one = F.try_variant_get(c, "$", "string")
    else:
        arr = c.cast("array<string>")
        one = F.lit(None).cast("string")
    value = F.when(arr.isNotNull(), encode(arr, handling)).otherwise(one)
    nul = F.when(arr.isNotNull(), F.exists(arr, lambda x: F.coalesce(F.instr(x, SEP) > 0, F.lit(False))))
    nul = nul.otherwise(F.coalesce(F.instr(one, SEP) > 0, F.lit(False)))
    reason = F.when(nul, F.lit(f"dimension [{name}]: a value contains U+0000"))
    if single:
        reason = reason.when(F.coalesce(F.size(_handled(arr, handling)) > 1, F.lit(False)),
                             F.lit(f"dimension [{name}]: multi-value in a range partition dimension"))
    return value, reason
