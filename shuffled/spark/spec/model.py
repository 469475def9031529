"""The parsed, validated form of a Druid ``index_parallel`` spec (see :mod:`shuffled.spark.spec.parse`).

Everything here is plain frozen data; it is what the driver plans from. Only the fields this
pipeline supports exist; :func:`shuffled.spark.spec.parse.parse_spec` refuses the rest by path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shuffled.protocol import Interval
from shuffled.spark.spec.flatten import FlattenSpec
from shuffled.spark.spec.transform import TransformSpec

#: Metric types and, for each, the Arrow/Parquet type of the stored value.
METRIC_TYPES: dict[str, str] = {
    "count": "long",
    "longSum": "long",
    "doubleSum": "double",
    "floatSum": "float",
    "longMin": "long",
    "longMax": "long",
    "doubleMin": "double",
    "doubleMax": "double",
    "floatMin": "float",
    "floatMax": "float",
    "longFirst": "long",
    "longLast": "long",
    "doubleFirst": "double",
    "doubleLast": "double",
    "floatFirst": "float",
    "floatLast": "float",
    "stringFirst": "string",
    "stringLast": "string",
    "HLLSketchBuild": "binary",
    "thetaSketch": "binary",
    "quantilesDoublesSketch": "binary",
}

#: The sketch metrics: the input type their values are read as and how rows combine.
SKETCH_INPUT: dict[str, str] = {"HLLSketchBuild": "string", "thetaSketch": "string",
                                "quantilesDoublesSketch": "double"}

#: How a metric is combined across partial results: count becomes a sum.
COMBINE: dict[str, str] = {
    "count": "sum",
    "longSum": "sum",
    "doubleSum": "sum",
    "floatSum": "sum",
    "longMin": "min",
    "longMax": "max",
    "doubleMin": "min",
    "doubleMax": "max",
    "floatMin": "min",
    "floatMax": "max",
    **{f"{t}{end}": end.lower() for t in ("long", "double", "float", "string")
       for end in ("First", "Last")},
    "HLLSketchBuild": "hll",
    "thetaSketch": "theta",
    "quantilesDoublesSketch": "quantiles",
}

#: stringFirst/stringLast's maxStringBytes when the spec leaves it out (Druid's default).
DEFAULT_MAX_STRING_BYTES = 1024

#: maxBytesInMemory when the spec leaves it at 0 or out: a phase-2 merge task's memory budget.
DEFAULT_BYTES_IN_MEMORY = 256 << 20

#: tuningConfig.partialCompression: Arrow IPC buffer compression of phase-1 partials.
PARTIAL_CODECS = ("none", "lz4", "zstd")
DEFAULT_PARTIAL_COMPRESSION = "lz4"  # measured: see README, "Compressed partials"

#: tuningConfig.indexSpec.dimensionCompression / metricCompression (Druid's names, lz4 its
#: default) -> the Parquet codec of the segment's dimension / metric (and __time) columns.
#: Druid's "lzf" has no Parquet codec: refused.
SEGMENT_CODECS = {"lz4": "lz4", "zstd": "zstd", "uncompressed": "none", "none": "none"}
DEFAULT_SEGMENT_CODEC = "lz4"

DIMENSION_TYPES = ("string", "long", "float", "double")
#: dimensionsSpec.dimensions[].multiValueHandling (Druid's MultiValueHandling; the default first)
MULTI_VALUE_HANDLING = ("SORTED_ARRAY", "SORTED_SET", "ARRAY")
TIMESTAMP_FORMATS = ("iso", "millis", "posix", "auto", "micro", "nano")


@dataclass(frozen=True)
class Dimension:
    """One dimension: its column name, value type (``string`` unless typed) and, for a
    string dimension, how a multi-value (an array) is stored: ``SORTED_ARRAY`` (Druid's
    default), ``SORTED_SET`` or ``ARRAY``."""

    name: str
    type: str = "string"
    multi_value_handling: str = "SORTED_ARRAY"


@dataclass(frozen=True)
class Metric:
    """One aggregator of ``metricsSpec``; ``field`` is None only for ``count``. First/last
    aggregators pick by ``time_column`` (``__time``: the row's timestamp) and string ones
    keep at most ``max_string_bytes`` characters of the value. Sketches have a size
    (``sketch_size``) and HLL ones a target type."""

    type: str
    name: str
    field: str | None
    time_column: str = "__time"
    max_string_bytes: int = DEFAULT_MAX_STRING_BYTES
    sketch_size: int = 0  # HLL and theta: lgK; quantiles: k
    hll_type: str = "HLL_4"

    @property
    def first_last(self) -> bool:
        return self.combine in ("first", "last")

    @property
    def input_type(self) -> str:
        """The type the input field is read as (a sketch's values, else the stored type)."""
        return SKETCH_INPUT.get(self.type, self.value_type)

    @property
    def value_type(self) -> str:
        return METRIC_TYPES[self.type]

    @property
    def combine(self) -> str:
        return COMBINE[self.type]


@dataclass(frozen=True)
class TimestampSpec:
    column: str = "timestamp"
    format: str = "auto"
    missing_value: int | None = None  # epoch millis used when the column is null


@dataclass(frozen=True)
class PartitionsSpec:
    """Secondary partitioning of each time chunk.

    ``type`` is ``hashed``, ``range`` (several dimensions), ``single_dim`` (one) or
    ``dynamic`` (treated as hashed over the whole rolled-up key: perfect rollup anyway).
    ``target_rows`` is what partition determination aims for when ``num_shards`` is None.
    """

    type: str = "dynamic"
    num_shards: int | None = None
    target_rows: int = 5_000_000
    max_rows: int | None = None
    dimensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputSource:
    """``local`` (``base_dir`` + ``filter`` or ``files``), ``inline`` (``data``), ``s3``
    (``uris``, ``prefixes`` + ``filter``, ``objects`` as ``s3://bucket/path``) or ``http``
    (``uris``)."""

    type: str
    base_dir: str | None = None
    filter: str | None = None
    files: tuple[str, ...] = ()
    data: str | None = None
    uris: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputFormat:
    """``json`` (lines, optionally with a ``flattenSpec``), ``csv`` or ``parquet``."""

    type: str
    columns: tuple[str, ...] = ()
    find_columns_from_header: bool = False
    skip_header_rows: int = 0
    delimiter: str = ","
    flatten: FlattenSpec = field(default_factory=FlattenSpec)


@dataclass(frozen=True)
class IngestSpec:
    """A validated ingestion spec: what to read, how to roll it up and partition it."""

    data_source: str
    timestamp: TimestampSpec
    dimensions: tuple[Dimension, ...]
    metrics: tuple[Metric, ...]
    segment_granularity: str
    query_granularity: str
    intervals: tuple[Interval, ...]
    rollup: bool
    input_source: InputSource
    input_format: InputFormat
    append_to_existing: bool = False
    partitions: PartitionsSpec = field(default_factory=PartitionsSpec)
    force_guaranteed_rollup: bool = False
    max_concurrent_subtasks: int = 1
    total_merge_tasks: int | None = None  # None: from phase 1's figures (phase2.merge_tasks)
    max_parse_exceptions: int = 2**31 - 1  # unparseable + processedWithError rows allowed
    log_parse_exceptions: bool = False  # log each saved parse exception (Druid's default: no)
    max_rows_in_memory: int = 1_000_000
    max_saved_parse_exceptions: int = 20
    max_bytes_in_memory: int = 256 << 20  # a merge task's budget; 0: unbounded (Druid's -1)
    partial_compression: str = DEFAULT_PARTIAL_COMPRESSION
    # Parquet codecs of the segments' dimension and metric columns (tuningConfig.indexSpec)
    dimension_codec: str = DEFAULT_SEGMENT_CODEC
    metric_codec: str = DEFAULT_SEGMENT_CODEC
    shuffle_replicas: int = 1  # daemons each partial is written to (tuningConfig, ours)
    shuffle_retry_seconds: int = 30  # a read's wait for a daemon that does not answer
    shuffle_durability: str = "local"  # "deep": the seal counts once offloaded (ours)
    shuffle_quota_bytes: int = 0  # per daemon, asked of the daemons (0: theirs only)
    shuffle_quota_partials: int = 0
    shuffle_token_seconds: int = 172_800  # lifetime of the per-task tokens (scoped mode)
    transform: TransformSpec = field(default_factory=TransformSpec)
    task_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def dimension_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dimensions)

    @property
    def input_fields(self) -> tuple[str, ...]:
        """Input columns the job reads (no duplicates): the timestamp, what the transforms
        and the filter read, and the dimensions and metric fields no transform produces."""
        produced = {t.name for t in self.transform.transforms}
        names = [self.timestamp.column, *sorted(self.transform.reads)]
        names += [n for n in self.dimension_names if n not in produced]
        names += [m.field for m in self.metrics if m.field is not None and m.field not in produced]
        names += [m.time_column for m in self.metrics
                  if m.first_last and m.time_column != "__time" and m.time_column not in produced]
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class PartitionPlan:
    """How rows of each time chunk are assigned a partition number.

    ``hashed``: ``pmod(hash(cols), shards)`` with ``shards`` = ``per_chunk[chunk]`` or
    ``num_shards``; ``cols`` are the partition dimensions, or ``__time`` plus every dimension.
    ``range``: partition i of a chunk holds keys in [boundaries[i-1], boundaries[i]).
    ``hash_ranges`` (the late plan, docs/slab.md): per chunk, partition i holds the rows
    whose uint32 ``hash(cols)`` is in ``[start, end)`` of its pair (None: unbounded).
    """

    kind: str
    dimensions: tuple[str, ...]
    num_shards: int = 1
    per_chunk: dict[int, int] = field(default_factory=dict)
    boundaries: dict[int, list[tuple[str | None, ...]]] = field(default_factory=dict)
    hash_ranges: dict[int, list[tuple[int | None, int | None]]] = field(default_factory=dict)

    def shards(self, chunk: int) -> int:
        if chunk in self.hash_ranges:
            return len(self.hash_ranges[chunk])
        if self.kind == "range":
            return len(self.boundaries.get(chunk, [])) + 1
        return self.per_chunk.get(chunk, self.num_shards)
