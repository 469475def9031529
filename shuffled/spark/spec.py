"""Parse and validate a Druid native batch spec (``"type": "index_parallel"``).

Druid users bring their specs unchanged; a field this pipeline does not support, or a value
that is invalid, raises :class:`SpecError` naming its JSON path (``spec.tuningConfig...``)
before any Spark work starts. Fields Druid uses only to tune its own processes (memory
limits, push timeouts, ...) are accepted and ignored; they are listed in ``_IGNORED``.
"""

from __future__ import annotations

import re
from typing import Any

from shuffled.errors import BadRequest, ShuffleError
from shuffled.protocol import Interval, parse_instant, validate_id
from shuffled.spark.granularity import GRANULARITIES
from shuffled.spark.model import (
    DIMENSION_TYPES,
    METRIC_TYPES,
    TIMESTAMP_FORMATS,
    Dimension,
    IngestSpec,
    InputFormat,
    InputSource,
    Metric,
    PartitionsSpec,
    TimestampSpec,
)

_NAME_RE = re.compile(r"[^\x00-\x1f/\\]{1,255}")


class SpecError(BadRequest):
    """An ingestion spec field is unsupported or invalid; ``path`` is its JSON path."""

    code = "invalid_spec"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}", path=path)
        self.path = path


# Keys Druid accepts that only tune Druid's own processes: accepted and ignored here.
_IGNORED: dict[str, set[str]] = {
    "tuningConfig": {
        "maxRowsInMemory", "maxBytesInMemory", "maxTotalRows", "maxRowsPerSegment",
        "numShards", "partitionDimensions", "indexSpec", "indexSpecForIntermediatePersists",
        "maxPendingPersists", "reportParseExceptions", "pushTimeout",
        "segmentWriteOutMediumFactory", "maxRetry", "taskStatusCheckPeriodMs",
        "chatHandlerTimeout", "chatHandlerNumRetries", "logParseExceptions",
        "maxSavedParseExceptions", "maxColumnsToMerge", "awaitSegmentAvailabilityTimeoutMillis",
        "maxAllowedLockCount", "splitHintSpec", "skipBytesInMemoryOverheadCheck",
        "numPersistThreads", "maxNumSegmentsToMerge", "totalNumMergeTasks",
        "maxNumConcurrentSubTasks", "maxParseExceptions", "forceGuaranteedRollup",
        "partitionsSpec", "type",
    },
}


class _Obj:
    """A JSON object being consumed: remembers its path and which keys were read."""

    def __init__(self, value: Any, path: str, *, required: bool = True) -> None:
        if value is None and not required:
            value = {}
        if not isinstance(value, dict):
            raise SpecError(path, "must be a JSON object")
        self.value: dict[str, Any] = value
        self.path = path
        self.seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        value = self.value.get(key)
        return default if value is None else value

    def obj(self, key: str, *, required: bool = True) -> _Obj:
        if required and self.value.get(key) is None:
            raise SpecError(self.at(key), "is required")
        self.seen.add(key)
        return _Obj(self.value.get(key), self.at(key), required=required)

    def str_(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.get(key, default)
        if value is None:
            if required:
                raise SpecError(self.at(key), "is required")
            return None
        if not isinstance(value, str) or not value:
            raise SpecError(self.at(key), f"must be a non-empty string, not {value!r}")
        return value

    def bool_(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(self.at(key), f"must be true or false, not {value!r}")
        return value

    def int_(self, key: str, default: int | None, minimum: int = 1) -> int | None:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise SpecError(self.at(key), f"must be an integer >= {minimum}, not {value!r}")
        return value

    def done(self, ignored: set[str] | frozenset[str] = frozenset()) -> None:
        """Refuse every key that was neither read nor listed as ignored."""
        for key in self.value:
            if key not in self.seen and key not in ignored:
                raise SpecError(self.at(key), "is not a supported field")


def _choice(obj: _Obj, key: str, allowed: tuple[str, ...] | list[str], default: str | None) -> str:
    value = obj.str_(key, default, required=default is None)
    assert value is not None
    if value not in allowed:
        raise SpecError(obj.at(key), f"{value!r} is not supported (one of {', '.join(allowed)})")
    return value


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value.startswith("__"):
        raise SpecError(path, f"{value!r} is not a valid column name")
    return value


def parse_spec(obj: Any) -> IngestSpec:
    """Validate a Druid ``index_parallel`` task spec (a dict, or an IngestSpec as is)."""
    if isinstance(obj, IngestSpec):
        return obj
    top = _Obj(obj, "$")
    kind = top.str_("type", required=True)
    if kind != "index_parallel":
        raise SpecError(top.at("type"), f"{kind!r} is not supported (only 'index_parallel')")
    task_id = top.str_("id")
    if task_id is not None:
        try:
            validate_id(task_id, "id")
        except ShuffleError as exc:
            raise SpecError(top.at("id"), exc.message) from None
    top.get("context")
    spec = top.obj("spec")
    top.done({"resource", "dataSource", "groupId"})
    schema = _data_schema(spec.obj("dataSchema"))
    io = _io_config(spec.obj("ioConfig"))
    tuning = _tuning(spec.obj("tuningConfig", required=False))
    spec.done()
    fields = {**schema, **io, **tuning}
    parsed = IngestSpec(task_id=task_id, raw=dict(obj), **fields)
    _check_consistency(parsed)
    return parsed


def _data_schema(o: _Obj) -> dict[str, Any]:
    data_source = o.str_("dataSource", required=True)
    assert data_source is not None
    try:
        validate_id(data_source, "dataSource")
    except ShuffleError as exc:
        raise SpecError(o.at("dataSource"), exc.message) from None
    ts = o.obj("timestampSpec")
    missing = ts.str_("missingValue")
    timestamp = TimestampSpec(
        column=_name(ts.get("column", "timestamp"), ts.at("column")),
        format=_choice(ts, "format", TIMESTAMP_FORMATS, "auto"),
        missing_value=_instant(missing, ts.at("missingValue")) if missing else None,
    )
    ts.done()
    dims = o.obj("dimensionsSpec")
    dimensions = _dimensions(dims)
    metrics = _metrics(o.get("metricsSpec", []), o.at("metricsSpec"))
    gran = o.obj("granularitySpec", required=False)
    _choice(gran, "type", ("uniform",), "uniform")
    segment = _granularity(gran, "segmentGranularity", "day")
    query = _granularity(gran, "queryGranularity", "none")
    rollup = gran.bool_("rollup", True)
    intervals = _intervals(gran.get("intervals"), gran.at("intervals"))
    gran.done()
    for key in ("parser", "transformSpec"):
        if o.get(key):
            raise SpecError(o.at(key), "is not supported")
    o.done()
    names = [d.name for d in dimensions] + [m.name for m in metrics]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(o.at("metricsSpec"), f"output column {name!r} is defined twice")
    return {
        "data_source": data_source, "timestamp": timestamp, "dimensions": dimensions,
        "metrics": metrics, "segment_granularity": segment, "query_granularity": query,
        "rollup": rollup, "intervals": intervals,
    }


def _dimensions(o: _Obj) -> tuple[Dimension, ...]:
    raw = o.get("dimensions", [])
    if not isinstance(raw, list) or not raw:
        raise SpecError(o.at("dimensions"), "must list the dimensions (schema discovery is not supported)")
    for key in ("dimensionExclusions", "spatialDimensions"):
        if o.get(key):
            raise SpecError(o.at(key), "is not supported")
    o.get("includeAllDimensions")
    if o.value.get("includeAllDimensions") or o.value.get("useSchemaDiscovery"):
        raise SpecError(o.at("useSchemaDiscovery"), "schema discovery is not supported")
    o.get("useSchemaDiscovery")
    o.done({"createBitmapIndex", "forceSegmentSortByTime"})
    out: list[Dimension] = []
    for i, item in enumerate(raw):
        path = f"{o.at('dimensions')}[{i}]"
        if isinstance(item, str):
            out.append(Dimension(_name(item, path)))
            continue
        d = _Obj(item, path)
        kind = _choice(d, "type", DIMENSION_TYPES, "string")
        if d.get("multiValueHandling") not in (None, "SORTED_ARRAY", "sorted_array"):
            raise SpecError(d.at("multiValueHandling"), "is not supported")
        out.append(Dimension(_name(d.get("name"), d.at("name")), kind))
        d.done({"createBitmapIndex"})
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        raise SpecError(o.at("dimensions"), "lists a dimension twice")
    return tuple(out)


def _metrics(raw: Any, path: str) -> tuple[Metric, ...]:
    if not isinstance(raw, list):
        raise SpecError(path, "must be a list of aggregators")
    out: list[Metric] = []
    for i, item in enumerate(raw):
        m = _Obj(item, f"{path}[{i}]")
        kind = _choice(m, "type", tuple(METRIC_TYPES), None)
        name = _name(m.get("name"), m.at("name"))
        fld = None
        if kind != "count":
            fld = _name(m.get("fieldName"), m.at("fieldName"))
        if m.get("expression") is not None:
            raise SpecError(m.at("expression"), "is not supported")
        m.done()
        out.append(Metric(kind, name, fld))
    return tuple(out)


def _granularity(o: _Obj, key: str, default: str) -> str:
    value = o.get(key, default)
    path = o.at(key)
    if isinstance(value, dict):
        g = _Obj(value, path)
        value = g.get("type")
        g.done()
    if not isinstance(value, str) or value.lower() not in GRANULARITIES:
        raise SpecError(path, f"{value!r} is not supported (one of {', '.join(GRANULARITIES)})")
    value = value.lower()
    if key == "segmentGranularity" and value == "none":
        raise SpecError(path, "'none' is not a segment granularity")
    return value


def _instant(text: str, path: str) -> int:
    try:
        return parse_instant(text, path)
    except ShuffleError as exc:
        raise SpecError(path, exc.message) from None


def _intervals(raw: Any, path: str) -> tuple[Interval, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SpecError(path, "must be a list of 'start/end' strings")
    out = []
    for i, text in enumerate(raw):
        try:
            out.append(Interval.parse_druid(text))
        except ShuffleError as exc:
            raise SpecError(f"{path}[{i}]", exc.message) from None
    return tuple(sorted(out))


def _io_config(o: _Obj) -> dict[str, Any]:
    _choice(o, "type", ("index_parallel",), "index_parallel")
    if o.value.get("firehose") is not None:
        raise SpecError(o.at("firehose"), "is not supported (use inputSource)")
    src = o.obj("inputSource")
    kind = _choice(src, "type", ("local", "inline"), None)
    if kind == "inline":
        data = src.str_("data", required=True)
        source = InputSource("inline", data=data)
    else:
        files = src.get("files", [])
        if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
            raise SpecError(src.at("files"), "must be a list of paths")
        base, flt = src.str_("baseDir"), src.str_("filter")
        if not files and not (base and flt):
            raise SpecError(src.path, "needs baseDir and filter, or files")
        if bool(base) != bool(flt):
            raise SpecError(src.at("filter" if base else "baseDir"), "is required with "
                            + ("baseDir" if base else "filter"))
        source = InputSource("local", base_dir=base, filter=flt, files=tuple(files))
    src.done()
    fmt = _input_format(o.obj("inputFormat"))
    if kind == "inline" and fmt.type == "parquet":
        raise SpecError(o.at("inputFormat.type"), "parquet cannot be given inline")
    append = o.bool_("appendToExisting", False)
    o.bool_("dropExisting", False)
    if o.value.get("dropExisting"):
        raise SpecError(o.at("dropExisting"), "is not supported")
    o.done()
    return {"input_source": source, "input_format": fmt, "append_to_existing": append}


def _input_format(f: _Obj) -> InputFormat:
    kind = _choice(f, "type", ("json", "csv", "parquet"), None)
    if f.value.get("flattenSpec") not in (None, {}, {"useFieldDiscovery": True}):
        raise SpecError(f.at("flattenSpec"), "is not supported")
    f.get("flattenSpec")
    if kind == "json":
        f.done({"featureSpec", "keepNullColumns", "assumeNewlineDelimited", "useJsonNodeReader"})
        return InputFormat("json")
    if kind == "parquet":
        f.done({"binaryAsString"})
        return InputFormat("parquet")
    columns = f.get("columns", [])
    if not isinstance(columns, list) or not all(isinstance(c, str) and c for c in columns):
        raise SpecError(f.at("columns"), "must be a list of column names")
    header = f.bool_("findColumnsFromHeader", bool(f.value.get("hasHeaderRow", False)))
    f.get("hasHeaderRow")
    if not header and not columns:
        raise SpecError(f.at("columns"), "is required unless findColumnsFromHeader is true")
    skip = f.int_("skipHeaderRows", 0, minimum=0) or 0
    f.done({"listDelimiter"})
    return InputFormat("csv", tuple(columns), header, skip)


def _tuning(o: _Obj) -> dict[str, Any]:
    _choice(o, "type", ("index_parallel",), "index_parallel")
    legacy_rows = o.int_("maxRowsPerSegment", None)
    legacy_shards = o.int_("numShards", None)
    ps = o.obj("partitionsSpec", required=False)
    kind = _choice(ps, "type", ("dynamic", "hashed", "range", "single_dim"),
                   "hashed" if legacy_shards else "dynamic")
    target = ps.int_("targetRowsPerSegment", None)
    max_rows = ps.int_("maxRowsPerSegment", None if kind != "dynamic" else legacy_rows)
    shards = ps.int_("numShards", legacy_shards if kind == "hashed" else None)
    if kind == "single_dim":
        dims: tuple[str, ...] = (_name(ps.get("partitionDimension"), ps.at("partitionDimension")),)
    else:
        raw_dims = ps.get("partitionDimensions", o.value.get("partitionDimensions") or [])
        if not isinstance(raw_dims, list):
            raise SpecError(ps.at("partitionDimensions"), "must be a list of dimension names")
        dims = tuple(_name(d, f"{ps.at('partitionDimensions')}[{i}]") for i, d in enumerate(raw_dims))
    if kind in ("range", "single_dim"):
        if shards is not None:
            raise SpecError(ps.at("numShards"), f"is not supported for {kind}")
        if not dims:
            raise SpecError(ps.at("partitionDimensions"), "is required for range partitioning")
    if kind == "hashed" and shards is not None and (target or max_rows):
        raise SpecError(ps.at("numShards"), "cannot be combined with targetRowsPerSegment/maxRowsPerSegment")
    if target and max_rows and kind != "dynamic":
        raise SpecError(ps.at("targetRowsPerSegment"), "cannot be combined with maxRowsPerSegment")
    ps.bool_("assumeGrouped", False)
    ps.done({"maxTotalRows", "partitionFunction"})
    if ps.value.get("partitionFunction") not in (None, "murmur3_32_abs"):
        raise SpecError(ps.at("partitionFunction"), "is not supported")
    goal = target or max_rows or 5_000_000
    partitions = PartitionsSpec(kind, shards, goal, max_rows, dims)
    out = {
        "partitions": partitions,
        "force_guaranteed_rollup": o.bool_("forceGuaranteedRollup", False),
        "max_concurrent_subtasks": o.int_("maxNumConcurrentSubTasks", 1),
        "total_merge_tasks": o.int_("totalNumMergeTasks", 10),
        "max_parse_exceptions": o.int_("maxParseExceptions", 2**31 - 1, minimum=0),
        "max_rows_in_memory": max(1000, o.int_("maxRowsInMemory", 1_000_000) or 1_000_000),
        "max_saved_parse_exceptions": o.int_("maxSavedParseExceptions", 20, minimum=0),
    }
    o.done(_IGNORED["tuningConfig"])
    return out


def _check_consistency(s: IngestSpec) -> None:
    ps = "$.spec.tuningConfig.partitionsSpec"
    if s.partitions.type in ("hashed", "range", "single_dim") and not s.force_guaranteed_rollup:
        raise SpecError("$.spec.tuningConfig.forceGuaranteedRollup",
                        f"must be true with a {s.partitions.type} partitionsSpec (as in Druid)")
    if s.partitions.type == "dynamic" and s.force_guaranteed_rollup:
        raise SpecError(f"{ps}.type", "forceGuaranteedRollup needs hashed or range partitioning")
    dims = set(s.dimension_names)
    for i, d in enumerate(s.partitions.dimensions):
        if d not in dims:
            raise SpecError(f"{ps}.partitionDimensions[{i}]", f"{d!r} is not a dimension")
    if s.partitions.type in ("range", "single_dim"):
        for i, d in enumerate(s.dimensions):
            if d.name in s.partitions.dimensions and d.type != "string":
                raise SpecError(f"{ps}.partitionDimensions", f"{d.name!r} is not a string dimension")
    if s.input_format.type == "csv" and s.input_format.columns:
        missing = [c for c in s.input_fields if c not in s.input_format.columns]
        if missing:
            raise SpecError("$.spec.ioConfig.inputFormat.columns", f"does not list {missing}")
