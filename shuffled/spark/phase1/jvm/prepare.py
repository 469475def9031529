"""Spark SQL (JVM-side) preparation of the input rows for phase 1.

Everything per row that can be done without Python is done here: timestamp parsing,
truncation to queryGranularity, the time chunk (segmentGranularity), the interval filter,
value typing, the reason a row is unparseable, and (given a :class:`PartitionPlan`) the
secondary partition number. Python only sees narrow, typed Arrow batches.

``__bad`` is NULL for a good row, ``'T'`` for a row thrown away (outside ``intervals``),
``'U\\t<file>\\t<line>\\t<reason>\\t<raw>'`` for an unparseable one and
``'E\\t<file>\\t<line>\\t<reasons>\\t<raw>'`` for one ingested with a parse error in
its columns (Druid's processedWithError: a numeric dimension's or metric's field that is
not a number is null; the row is kept and counted apart).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shuffled.spark.spec.granularity import spark_truncate, truncate
from shuffled.spark.spec.model import IngestSpec, PartitionPlan
from shuffled.spark.spec.transform import TIME as DRUID_TIME
from shuffled.spark.phase1.jvm.filters import filter_column
from shuffled.spark.phase1.jvm.multivalue import can_hold_arrays, string_dimension
from shuffled.spark.phase1.jvm.sqlexpr import LONG, Translator, Val, as_value, input_val
from shuffled.spark.phase1.columns import metric_column, metric_time_column
from shuffled.spark.rows.rollup import BAD, CHUNK, TIME, WITH_ERROR

_TS = "__ts"
_TS_OUT = "__ts_out"  # the timestamp after a transform named __time
_KEEP = "__keep"  # transformSpec.filter: true keeps the row
_TRANSFORMS = "$.spec.dataSchema.transformSpec"
_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType,
            T.DecimalType)
_SQL_TYPES = {"long": "bigint", "double": "double", "float": "float", "string": "string"}


def multi_value_dimensions(df: DataFrame, spec: IngestSpec) -> tuple[str, ...]:
    """The string dimensions of ``df`` (:func:`load_input`'s rows) that may carry
    multi-values: JSON string dimensions with their array column beside them
    (:func:`shuffled.spark.phase1.jvm.multivalue.json_arrays`) and Parquet list columns, unless a transform produces
    the dimension."""
    types = {f.name: f.dataType for f in df.schema.fields}
    produced = {t.name for t in spec.transform.transforms}
    return tuple(d.name for d in spec.dimensions
                 if d.type == "string" and d.name not in produced and can_hold_arrays(d.name, types))


def _is(dtype: T.DataType, kinds: tuple[type, ...]) -> bool:
    return isinstance(dtype, kinds)


def floor_long(d: Column) -> Column:
    """``floor(d)`` as a BIGINT, null where it does not fit: Spark's floor raises on NaN,
    infinities and anything beyond 2^63 under ANSI, which would fail the job on one value."""
    fits = (d >= F.lit(-(2.0 ** 63))) & (d < F.lit(2.0 ** 63))
    return F.when(fits, F.floor(d)).cast("bigint")


def _timestamp(c: Column, dtype: T.DataType, fmt: str) -> Column:
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_millis(c.cast("timestamp"))
    if isinstance(dtype, T.DateType):
        return F.unix_millis(c.cast("timestamp"))
    scale = {"posix": 1000.0, "micro": 0.001, "nano": 0.000001}.get(fmt)
    if _is(dtype, _NUMERIC):
        number = c.cast("double")
    else:
        c = F.trim(c.cast("string"))
        number = c.try_cast("double")
    if scale is not None:
        return floor_long(number * F.lit(scale))
    as_millis = F.coalesce(c.try_cast("bigint"), floor_long(number))
    if fmt == "millis" or _is(dtype, _NUMERIC):
        return as_millis
    iso = F.unix_millis(c.try_cast("timestamp"))
    if fmt == "iso":
        return iso
    return F.when(c.rlike(r"^-?[0-9]+$"), as_millis).otherwise(iso)  # auto


def _typed(c: Column, dtype: T.DataType, kind: str) -> tuple[Column, Column | None]:
    """The value as ``kind`` and (for text input) a 'could not parse' condition."""
    if kind == "string":
        return c.cast("string"), None
    sql = _SQL_TYPES[kind]
    if _is(dtype, _NUMERIC):
        return c.try_cast(sql), None  # try_: a transform may give NaN or Infinity
    text = F.nullif(F.trim(c.cast("string")), F.lit(""))
    if kind == "long":
        value = F.coalesce(text.try_cast("bigint"), floor_long(text.try_cast("double")))
    else:
        value = text.try_cast(sql)
    return value, text.isNotNull() & value.isNull()


def apply_transforms(df: DataFrame, spec: IngestSpec) -> DataFrame:
    """``df`` (with ``__ts``) with the transforms' outputs in place of the columns they
    shadow, ``__ts_out`` (the timestamp a ``__time`` transform gives) and ``__keep``.

    Every transform reads the input row as it was (Druid's rule); the filter reads the row
    after the transforms. All of it is one Spark projection.
    """
    before: dict[str, Val] = {DRUID_TIME: Val(F.col(_TS), LONG)}
    for f in df.schema.fields:
        # A Parquet list only a dimension reads (a multi-value) is not an expression input.
        if f.name in spec.input_fields and (f.name in spec.transform.reads
                                            or not isinstance(f.dataType, T.ArrayType)):
            before[f.name] = input_val(F.col(f"`{f.name}`"), f.dataType, f.name, _TRANSFORMS)
    after = dict(before)
    for i, t in enumerate(spec.transform.transforms):
        path = f"{_TRANSFORMS}.transforms[{i}].expression"
        after[t.name] = as_value(Translator(before, path)(t.node))
    keep: Column = F.lit(True)
    if spec.transform.filter is not None:
        keep = F.coalesce(filter_column(spec.transform.filter, after, f"{_TRANSFORMS}.filter"),
                          F.lit(False))
    produced = {t.name for t in spec.transform.transforms} - {DRUID_TIME}
    cols = [F.col(f"`{c}`") for c in df.columns if c not in produced]
    cols += [after[name].col.alias(name) for name in sorted(produced)]
    time = after[DRUID_TIME]
    cols.append((time.col if time.type == LONG else F.lit(None)).cast("bigint").alias(_TS_OUT))
    return df.select(*cols, keep.alias(_KEEP))


def prepare(df: DataFrame, spec: IngestSpec) -> DataFrame:
    """Typed rows: ``__chunk, __time, <dimensions>, __m<i>..., __bad`` (see module doc)."""
    types = {f.name: f.dataType for f in df.schema.fields}
    ts = spec.timestamp
    raw_ts = F.col(f"`{ts.column}`")
    millis = _timestamp(raw_ts, types[ts.column], ts.format)
    if ts.missing_value is not None:
        millis = F.when(raw_ts.isNull(), F.lit(ts.missing_value)).otherwise(millis)
    df = df.withColumn(_TS, millis)
    time_col, keep = _TS, F.lit(True)
    problems: list[tuple[Column, Column]] = [
        (F.col("__corrupt"), F.lit("malformed " + spec.input_format.type + " record")),
        (F.col(_TS).isNull(), F.concat(F.lit("unparseable timestamp ["),
                                        F.coalesce(raw_ts.cast("string"), F.lit("null")), F.lit("]"))),
    ]
    if spec.transform:
        df = apply_transforms(df, spec)
        types = {f.name: f.dataType for f in df.schema.fields}
        time_col, keep = _TS_OUT, F.col(_KEEP)
        problems.append((F.col(_TS_OUT).isNull(), F.lit("the __time transform gave null")))
    errors: list[tuple[Column, Column]] = []  # parse errors of a column: the row is kept
    cols: list[Column] = []
    single = spec.partitions.dimensions if spec.partitions.type in ("range", "single_dim") else ()
    for d in spec.dimensions:
        src = F.col(f"`{d.name}`")
        if d.type == "string" and can_hold_arrays(d.name, types):
            value, why = string_dimension(d.name, types, d.multi_value_handling, d.name in single)
            cols.append(value.alias(d.name))
            problems.append((why.isNotNull(), why))
            continue
        value, bad = _typed(src, types[d.name], d.type)
        cols.append(value.alias(d.name))
        if bad is not None:
            errors.append((bad, F.concat(F.lit(f"dimension [{d.name}]: not a {d.type} ["),
                                         src.cast("string"), F.lit("]"))))
    for i, m in enumerate(spec.metrics):
        if m.field is None:
            continue
        src = F.col(f"`{m.field}`")
        value, bad = _typed(src, types[m.field], m.input_type)
        if m.first_last and m.value_type == "string":  # Druid's loose chop: characters, not bytes
            value = F.substring(value, 1, m.max_string_bytes)
        cols.append(value.alias(metric_column(i)))
        if m.first_last:
            cols.append(_first_last_time(m.time_column, time_col, types).alias(metric_time_column(i)))
        if bad is not None:
            errors.append((bad, F.concat(F.lit(f"field [{m.field}] of metric [{m.name}]: not a number ["),
                                         src.cast("string"), F.lit("]"))))
    reason = F.when(problems[0][0], problems[0][1])
    for cond, text in problems[1:]:
        reason = reason.when(cond, text)
    file = F.col("__file") if "__file" in df.columns else F.input_file_name()

    def location(flag: str, why: Column) -> Column:
        return F.concat_ws("\t", F.lit(flag), F.coalesce(file, F.lit("")),
                           F.coalesce(F.col("__line").cast("string"), F.lit("")), why,
                           F.coalesce(F.substring(F.col("__raw"), 1, 1000), F.lit("")))

    chunk = F.expr(spark_truncate(time_col, spec.segment_granularity))
    keep = keep & _in_intervals(chunk, spec)
    bad = F.when(reason.isNotNull(), location("U", reason)).when(~keep, F.lit("T"))
    if errors:  # every column's error, in the order of the spec, as Druid lists them
        why = F.concat_ws("; ", *[F.when(cond, text) for cond, text in errors])
        bad = bad.when(F.length(why) > 0, location(WITH_ERROR, why))
    return df.select(
        F.expr(spark_truncate(time_col, spec.query_granularity)).alias(TIME),
        chunk.alias(CHUNK), *cols, bad.alias(BAD),
    )


def _first_last_time(column: str, time_col: str, types: dict[str, T.DataType]) -> Column:
    """The time a first/last aggregator picks by: ``__time`` is the row's timestamp in
    epoch millis before queryGranularity (as Druid's aggregators see the row); any other
    column is read as epoch millis (a number, or a Parquet timestamp), null when it is not
    one: such a row is never picked."""
    if column == DRUID_TIME:
        return F.col(time_col)
    return _timestamp(F.col(f"`{column}`"), types[column], "millis")


def _in_intervals(chunk: Column, spec: IngestSpec) -> Column:
    """True when the row's time chunk overlaps one of ``intervals`` (Druid's bucket rule)."""
    if not spec.intervals:
        return F.lit(True)
    cond: Column | None = None
    for iv in spec.intervals:
        first = truncate(iv.start, spec.segment_granularity)
        part = (chunk >= F.lit(first)) & (chunk < F.lit(iv.end))
        cond = part if cond is None else (cond | part)
    assert cond is not None
    return cond


def hash_columns(plan: PartitionPlan, spec: IngestSpec) -> list[Column]:
    """The columns the hashed partition function covers."""
    if plan.dimensions:
        return [F.col(f"`{d}`") for d in plan.dimensions]
    return [F.col(TIME), *[F.col(f"`{d}`") for d in spec.dimension_names]]


def range_key(dims: tuple[str, ...] | list[str], values: tuple[str | None, ...] | None = None) -> Column:
    """A comparable struct of the range dimensions, nulls before any value."""
    parts: list[Column] = []
    for i, d in enumerate(dims):
        if values is None:
            c = F.col(f"`{d}`").cast("string")
            parts += [c.isNotNull().alias(f"n{i}"), F.coalesce(c, F.lit("")).alias(f"v{i}")]
        else:
            v = values[i]
            parts += [F.lit(v is not None).alias(f"n{i}"), F.lit(v or "").alias(f"v{i}")]
    return F.struct(*parts)


def bucket_column(plan: PartitionPlan, spec: IngestSpec) -> Column:
    """The partition number of each row under ``plan`` (an INT column)."""
    chunk = F.col(CHUNK)
    if plan.kind == "range":
        key = range_key(plan.dimensions)
        expr: Column | None = None
        for c, bounds in sorted(plan.boundaries.items()):
            if not bounds:
                continue
            count = sum((F.when(key >= range_key(plan.dimensions, b), 1).otherwise(0) for b in bounds),
                        F.lit(0))
            expr = F.when(chunk == F.lit(c), count) if expr is None else expr.when(chunk == F.lit(c), count)
        return (F.lit(0) if expr is None else expr.otherwise(0)).cast("int")
    shards: Column = F.lit(plan.num_shards)
    if plan.per_chunk:
        mapping = F.create_map(*[x for c, n in sorted(plan.per_chunk.items()) for x in (F.lit(c), F.lit(n))])
        shards = F.coalesce(F.element_at(mapping, chunk), F.lit(1))
    return F.pmod(F.hash(*hash_columns(plan, spec)), shards).cast("int")
