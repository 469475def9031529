"""Phase 1 without the JVM hand-off: Parquet, JSON and CSV input read by pyarrow on the executors.

Handing rows from Spark's JVM to Python costs ~5 s of JVM CPU per 10M rows here (row
conversion plus Arrow encoding), more than Spark's whole groupBy. For Parquet input the rows
never need to be in the JVM at all: the driver plans splits (row groups) from the files'
footers, each Spark task reads its split with pyarrow, computes exactly the columns
:func:`shuffled.spark.phase1.jvm.prepare.prepare` would (time, chunk, typed dimensions and metrics, the
bad-row flag), rolls up, and assigns hashed partitions with Spark's own hash
(:mod:`shuffled.spark.phase1.spark_compat.murmur3`) *after* the rollup, on far fewer rows.

The native path is taken only where it provably computes what the JVM path computes
(:func:`plan_native` says why not otherwise): Parquet input, hashed (or dynamic) or range
partitioning over string/long columns, integer/timestamp/date timestamps, string or integer
dimensions, numeric metric fields. Everything else falls back to the JVM path.

Newline-delimited JSON and CSV are read natively too (:mod:`shuffled.spark.phase1.native.text.plan` plans byte blocks,
:mod:`shuffled.spark.phase1.native.text.reader` reads them, Spark's typing of text computed on Arrow), with their
transforms (:mod:`shuffled.spark.phase1.arrow_expr.transform`) and range partitioning (:mod:`shuffled.spark.phase1.native.ranges`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shuffled.spark.spec.granularity import truncate, truncate_array
from shuffled.spark.fs import remote
from shuffled.spark.spec.model import IngestSpec, PartitionPlan
from shuffled.spark.phase1.columns import metric_column
from shuffled.spark.rows.rollup import BAD, CHUNK, TIME
from shuffled.spark.phase1.spark_compat.murmur3 import pmod_hash
from shuffled.spark.phase1.native.ranges import RangeBucketer
from shuffled.spark.phase1.native.text.plan import text_input
from shuffled.spark.phase1.native.text.blocks import ByteMeter
from shuffled.spark.phase1.native.text.prepare import TextInput
from shuffled.spark.phase1.native.text.reader import read_text

_UNITS = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30,
          "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}
#: Why the native reader ran (the task report's readerReason).
NATIVE_REASON = "Parquet input with hashed or dynamic partitioning the native reader covers"
_TS_SCALE = {"posix": 1000.0, "micro": 0.001, "nano": 0.000001}


@dataclass(frozen=True)
class Split:
    """Row groups of one Parquet file (or blocks of a text file) read by one task."""

    path: str
    row_groups: tuple[int, ...]  # text: block numbers (see NativeInput.text.block)
    nbytes: int
    dictionary: tuple[str, ...] = ()  # string columns of this file read dictionary-encoded


@dataclass(frozen=True)
class Bucketer:
    """The hashed partition of rolled-up rows: ``pmod(hash(columns), shards(chunk))``."""

    columns: tuple[str, ...]
    num_shards: int
    per_chunk: dict[int, int] = field(default_factory=dict)

    def __call__(self, table: pa.Table) -> np.ndarray:
        """The partition (int32) of every row of ``table`` (``__chunk`` and the columns)."""
        chunks = table.column(CHUNK).to_numpy()
        shards: np.ndarray | np.int64
        if self.per_chunk:
            keys = np.array(sorted(self.per_chunk), dtype=np.int64)
            vals = np.array([self.per_chunk[k] for k in keys.tolist()], dtype=np.int64)
            pos = np.clip(np.searchsorted(keys, chunks), 0, max(len(keys) - 1, 0))
            found = (keys[pos] == chunks) if len(keys) else np.zeros(len(chunks), bool)
            shards = np.where(found, vals[pos] if len(keys) else 1, 1)
        else:
            shards = np.int64(self.num_shards)
        return pmod_hash([table.column(c) for c in self.columns], shards)


@dataclass(frozen=True)
class NativeInput:
    """How a task turns Parquet rows into phase-1 rows (see :func:`prepare_batch`)."""

    ts_column: str
    ts_format: str
    missing_value: int | None
    dims: tuple[tuple[str, str], ...]  # (name, type)
    metrics: tuple[tuple[str, str, str], ...]  # (column, value type, field)
    query_granularity: str
    segment_granularity: str
    intervals: tuple[tuple[int, int], ...]  # (first chunk start, end)
    bucketer: Bucketer | RangeBucketer
    text: TextInput | None = None  # JSON or CSV: how to read and type the lines
    reason: str = NATIVE_REASON  # the task report's readerReason


def _timestamp_millis(col: pa.ChunkedArray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Epoch millis and validity, as ``prepare._timestamp`` computes them in the JVM."""
    t = col.type
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(t):
        per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[t.unit]
        raw = col.cast(pa.int64()).fill_null(0).to_numpy()
        return (raw * 1000 if per_ms is None else np.floor_divide(raw, per_ms)), valid
    if pa.types.is_date32(t):
        return col.cast(pa.int32()).fill_null(0).to_numpy().astype(np.int64) * 86_400_000, valid
    raw = col.cast(pa.int64()).fill_null(0).to_numpy()
    scale = _TS_SCALE.get(fmt)
    if scale is None:
        return raw, valid
    scaled = np.floor(raw.astype(np.float64) * scale)  # the same double arithmetic as Spark
    ok = (scaled >= -(2.0 ** 63)) & (scaled < 2.0 ** 63)
    return np.where(ok, scaled, 0).astype(np.int64), valid & ok


def prepare_batch(table: pa.Table, spec: NativeInput, path: str, first_row: int) -> pa.Table:
    """``__chunk, __time, <dims>, __m<i>..., __bad`` for the rows of ``table``."""
    n = table.num_rows
    names = set(table.column_names)
    ts_col = table.column(spec.ts_column) if spec.ts_column in names else pa.chunked_array(
        [pa.nulls(n, pa.int64())])
    millis, valid = _timestamp_millis(ts_col, spec.ts_format)
    if spec.missing_value is not None:
        millis = np.where(valid, millis, spec.missing_value)
        valid = np.ones(n, dtype=bool)
    chunk = truncate_array(millis, spec.segment_granularity)
    keep = np.zeros(n, dtype=bool) if spec.intervals else np.ones(n, dtype=bool)
    for first, end in spec.intervals:
        keep |= (chunk >= first) & (chunk < end)
    bad = _bad_flags(ts_col, valid, keep, path, first_row)
    cols: dict[str, pa.Array | pa.ChunkedArray] = {
        CHUNK: pa.array(chunk), TIME: pa.array(truncate_array(millis, spec.query_granularity))}
    for name, kind in spec.dims:
        if name in names:
            src = table.column(name)
        elif kind == "string":
            # Absent from this file: all null, dictionary-encoded like the string columns of
            # the files that have it, so that the task's tables concatenate.
            src = pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], pa.string()))
        else:
            src = pa.nulls(n, pa.int64())
        cols[name] = compact(src) if kind == "string" else src.cast(pa.int64())
    for column, kind, source in spec.metrics:
        src = table.column(source) if source in names else pa.nulls(n, pa.int64())
        target = {"long": pa.int64(), "double": pa.float64(), "float": pa.float32(),
                  "string": pa.string()}[kind]
        cols[column] = src.cast(target, safe=False)
    cols[BAD] = bad
    return pa.table(cols)


def compact(col: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A dictionary column with a dictionary of only the values its rows use, when the
    dictionary is over twice the rows: Parquet's reader hands the batches of a row group the
    dictionary read so far (batch k of a column that never repeats carries k batches' worth
    of values), which held and unified across a task's raw rows cost more than the rows."""
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([compact(c) for c in col.chunks], col.type)
    if not pa.types.is_dictionary(col.type) or len(col.dictionary) <= 2 * len(col):
        return col
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    idx = col.indices.fill_null(0).to_numpy(zero_copy_only=False)
    used, remap = np.unique(idx[valid], return_inverse=True)
    codes = np.zeros(len(col), dtype=np.int32)
    codes[valid] = remap
    indices = pa.array(codes, pa.int32(), mask=None if valid.all() else ~valid)
    return pa.DictionaryArray.from_arrays(indices, col.dictionary.take(pa.array(used)))


def _bad_flags(ts_col: pa.ChunkedArray, valid: np.ndarray, keep: np.ndarray, path: str,
               first_row: int) -> pa.Array:
    """NULL for a good row, 'T' thrown away, 'U\\t<file>\\t<row>\\t<reason>\\t' unparseable."""
    if valid.all() and keep.all():
        return pa.nulls(len(valid), pa.string())
    out: list[str | None] = [None] * len(valid)
    for i in np.flatnonzero(~keep & valid).tolist():
        out[i] = "T"
    uri = "file://" + path
    for i in np.flatnonzero(~valid).tolist():
        shown = ts_col[i].as_py()
        out[i] = f"U\t{uri}\t{first_row + i + 1}\tunparseable timestamp [{'null' if shown is None else shown}]\t"
    return pa.array(out, pa.string())


def _source(path: str) -> str | pa.NativeFile:
    """A local path as is; an object-store URI opened for random access (pyarrow.fs)."""
    return remote.open_random(path) if remote.is_remote(path) else path


#: Rows read at a time from a row group: a writer's row group can hold millions of rows,
#: which read whole (and prepared: about twice its size) took a task's memory beyond its
#: budget before any rollup began.
READ_ROWS = 1 << 17


def read_split(split: Split, spec: NativeInput, columns: list[str],
               meter: ByteMeter | None = None) -> Iterator[pa.Table]:
    """The phase-1 rows of ``split``, up to :data:`READ_ROWS` rows at a time (text: per
    piece of lines, :data:`shuffled.spark.phase1.native.text.blocks.PIECE` bytes, the bytes read counted in ``meter``;
    Parquet's processedBytes are its files' sizes, counted by the driver)."""
    if spec.text is not None:
        yield from read_text(split.path, split.row_groups, spec, meter)
        return
    pf = pq.ParquetFile(_source(split.path), read_dictionary=list(split.dictionary))
    present = [c for c in columns if c in pf.schema_arrow.names]
    offsets = np.cumsum([0] + [pf.metadata.row_group(i).num_rows
                               for i in range(pf.metadata.num_row_groups)])
    for rg in split.row_groups:
        first = int(offsets[rg])
        for batch in pf.iter_batches(batch_size=READ_ROWS, row_groups=[rg], columns=present,
                                     use_threads=False):
            yield prepare_batch(pa.Table.from_batches([batch]), spec, split.path, first)
            first += batch.num_rows


def _schema_problem(schema: pa.Schema, spec: IngestSpec) -> str | None:
    """Why these input types cannot go the native way (None if they can)."""
    types = {f.name: f.type for f in schema}
    ts = types.get(spec.timestamp.column)
    if ts is not None and not (pa.types.is_integer(ts) or pa.types.is_timestamp(ts)
                               or pa.types.is_date32(ts)):
        return f"timestamp column type {ts}"
    for d in spec.dimensions:
        if d.type not in ("string", "long"):
            return f"{d.type} dimension {d.name}"
        t = types.get(d.name)
        if t is None:
            continue
        if d.type == "string" and (pa.types.is_list(t) or pa.types.is_large_list(t)):
            return (f"dimension {d.name} is a list (multi-value dimensions are encoded "
                    "by Spark SQL expressions)")
        if d.type == "string" and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            return f"dimension {d.name} of type {t}"
        if d.type == "long" and not pa.types.is_integer(t):
            return f"long dimension {d.name} of type {t}"
    for m in spec.metrics:
        t = types.get(m.field) if m.field else None
        if t is None:
            continue
        if m.input_type == "string":  # HLL and theta hash the text Spark would cast it to
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                return f"sketch field {m.field} of type {t} (the native reader hashes strings)"
            continue
        if not (pa.types.is_integer(t) or (pa.types.is_floating(t) and m.input_type != "long")):
            return f"metric field {m.field} of type {t} for a {m.input_type} metric"
    return None


def parse_bytes(text: str) -> int:
    """A Spark byte-size setting ("128m", "256k", "134217728") in bytes."""
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits) * _UNITS.get(t[len(digits):], 1)


@dataclass(frozen=True)
class SplitSizing:
    """Spark's file-split settings: ``maxPartitionBytes``, ``openCostInBytes``, parallelism."""

    max_bytes: int = 128 << 20
    open_cost: int = 4 << 20
    parallelism: int = 2
    max_tasks: int = 1  # maxNumConcurrentSubTasks; > 1 caps the number of tasks


def plan_native(spec: IngestSpec, plan: PartitionPlan, files: list[str],
                sizing: SplitSizing) -> tuple[NativeInput, list[list[Split]]] | str:
    """The native input description and the splits per task, or why the JVM path is needed."""
    if spec.input_format.type in ("json", "csv"):
        planned_text = text_input(spec, files, sizing)
        if isinstance(planned_text, str):
            return planned_text
        text, blocks = planned_text
        return (_native_input(spec, plan, text),
                pack([Split(path, numbers, size) for path, numbers, size in blocks], sizing))
    if spec.input_format.type != "parquet" or not files:
        return "input is not Parquet files"
    if spec.transform:
        return "the spec has a transformSpec (transforms and filters run as Spark SQL expressions)"
    first_last = [m.name for m in spec.metrics if m.first_last]
    if first_last:
        return (f"first/last aggregators ({', '.join(first_last)}) pick by time columns "
                "Spark SQL prepares")
    row_groups: list[Split] = []
    for path in files:
        try:
            pf = pq.ParquetFile(_source(path))
        except (OSError, pa.ArrowException) as exc:
            return f"cannot read the footer of {path}: {exc}"
        problem = _schema_problem(pf.schema_arrow, spec)
        if problem:
            return f"{path}: {problem}"
        meta = pf.metadata
        names = set(pf.schema_arrow.names)
        dictionary = tuple(d.name for d in spec.dimensions if d.type == "string" and d.name in names)
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            size = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            row_groups.append(Split(path, (i,), size, dictionary))
    return _native_input(spec, plan), pack(row_groups, sizing)


def _native_input(spec: IngestSpec, plan: PartitionPlan, text: TextInput | None = None) -> NativeInput:
    """What every task of ``spec`` needs, with the partition function of ``plan``."""
    if plan.kind == "range":
        bucketer: Bucketer | RangeBucketer = RangeBucketer(plan.dimensions, dict(plan.boundaries))
    else:
        bucketer = Bucketer(tuple(plan.dimensions or (TIME, *spec.dimension_names)),
                            plan.num_shards, dict(plan.per_chunk))
    return NativeInput(
        ts_column=spec.timestamp.column, ts_format=spec.timestamp.format,
        missing_value=spec.timestamp.missing_value,
        dims=tuple((d.name, d.type) for d in spec.dimensions),
        # A sketch's input is its values as text (HLL, theta) or doubles (quantiles).
        metrics=tuple((metric_column(i), m.input_type, m.field)
                      for i, m in enumerate(spec.metrics) if m.field),
        query_granularity=spec.query_granularity, segment_granularity=spec.segment_granularity,
        intervals=tuple((truncate(iv.start, spec.segment_granularity), iv.end)
                        for iv in spec.intervals),
        bucketer=bucketer, text=text, reason=text.reason if text else NATIVE_REASON)


def pack(row_groups: list[Split], sizing: SplitSizing) -> list[list[Split]]:
    """Consecutive row groups packed into tasks of about Spark's file split size.

    Like Spark: ``min(maxPartitionBytes, max(openCostInBytes, total / parallelism))`` per
    task (a row group is never cut); ``max_tasks`` > 1 caps the number of tasks.
    """
    total = sum(s.nbytes for s in row_groups)
    max_tasks = sizing.max_tasks
    target = min(sizing.max_bytes,
                 max(sizing.open_cost, math.ceil(total / max(sizing.parallelism, 1))))
    if max_tasks > 1:
        target = max(target, math.ceil(total / max_tasks))
    tasks: list[list[Split]] = []
    size = 0
    for rg in row_groups:
        if not tasks or (size + rg.nbytes > target and size > 0):
            if max_tasks > 1 and len(tasks) >= max_tasks:
                tasks[-1].append(rg)
                continue
            tasks.append([])
            size = 0
        tasks[-1].append(rg)
        size += rg.nbytes
    return tasks
