"""Parse and validate a Druid native batch spec (``"type": "index_parallel"``).

Druid users bring their specs unchanged; a field this pipeline does not support, or a value
that is invalid, raises :class:`SpecError` naming its JSON path (``spec.tuningConfig...``)
before any Spark work starts. Fields Druid uses only to tune its own processes (memory
limits, push timeouts, ...) are accepted and ignored; they are listed in ``IGNORED``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shuffled.errors import ShuffleError
from shuffled.protocol import Interval, parse_instant, validate_id
from shuffled.spark.spec.granularity import GRANULARITIES
from shuffled.spark.spec.model import (
    DEFAULT_MAX_STRING_BYTES,
    DIMENSION_TYPES,
    MULTI_VALUE_HANDLING,
    METRIC_TYPES,
    SKETCH_INPUT,
    TIMESTAMP_FORMATS,
    Dimension,
    IngestSpec,
    Metric,
    TimestampSpec,
)
from shuffled.spark.spec.base import SpecError, JsonObject, choice, col_name, interval_list
from shuffled.spark.spec.ioconfig import check_consistency, io_config, parse_tuning
from shuffled.spark.spec.transform import parse_transform_spec

__all__ = ["SpecError", "parse_spec"]


def parse_spec(obj: Any) -> IngestSpec:
    """Validate a Druid ``index_parallel`` task spec (a dict, or an IngestSpec as is)."""
    if isinstance(obj, IngestSpec):
        return obj
    top = JsonObject(obj, "$")
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
    io = io_config(spec.obj("ioConfig"))
    tuning = parse_tuning(spec.obj("tuningConfig", required=False))
    spec.done()
    fields = {**schema, **io, **tuning}
    parsed = IngestSpec(task_id=task_id, raw=dict(obj), **fields)
    check_consistency(parsed)
    return parsed


def _data_schema(o: JsonObject) -> dict[str, Any]:
    data_source = o.str_("dataSource", required=True)
    assert data_source is not None
    try:
        validate_id(data_source, "dataSource")
    except ShuffleError as exc:
        raise SpecError(o.at("dataSource"), exc.message) from None
    ts = o.obj("timestampSpec")
    missing = ts.str_("missingValue")
    timestamp = TimestampSpec(
        column=col_name(ts.get("column", "timestamp"), ts.at("column")),
        format=choice(ts, "format", TIMESTAMP_FORMATS, "auto"),
        missing_value=_instant(missing, ts.at("missingValue")) if missing else None,
    )
    ts.done()
    dims = o.obj("dimensionsSpec")
    dimensions = _dimensions(dims)
    metrics = _metrics(o.get("metricsSpec", []), o.at("metricsSpec"))
    gran = o.obj("granularitySpec", required=False)
    choice(gran, "type", ("uniform",), "uniform")
    segment = _granularity(gran, "segmentGranularity", "day")
    query = _granularity(gran, "queryGranularity", "none")
    rollup = gran.bool_("rollup", True)
    intervals = _intervals(gran.get("intervals"), gran.at("intervals"))
    gran.done()
    if o.get("parser"):
        raise SpecError(o.at("parser"), "is not supported (use ioConfig.inputFormat)")
    transform = parse_transform_spec(o.obj("transformSpec", required=False))
    o.done()
    names = [d.name for d in dimensions] + [m.name for m in metrics]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(o.at("metricsSpec"), f"output column {name!r} is defined twice")
    return {
        "data_source": data_source, "timestamp": timestamp, "dimensions": dimensions,
        "metrics": metrics, "segment_granularity": segment, "query_granularity": query,
        "rollup": rollup, "intervals": intervals, "transform": transform,
    }


def _dimensions(o: JsonObject) -> tuple[Dimension, ...]:
    raw = o.get("dimensions", [])
    if not isinstance(raw, list) or not raw:
        raise SpecError(o.at("dimensions"), "must list the dimensions (schema discovery is not supported)")
    for key in ("dimensionExclusions", "spatialDimensions"):
        if o.get(key):
            raise SpecError(o.at(key), "is not supported")
    for key in ("includeAllDimensions", "useSchemaDiscovery"):
        if o.get(key):
            raise SpecError(o.at(key), "schema discovery is not supported")
    o.done({"createBitmapIndex", "forceSegmentSortByTime"})
    out: list[Dimension] = []
    for i, item in enumerate(raw):
        path = f"{o.at('dimensions')}[{i}]"
        if isinstance(item, str):
            out.append(Dimension(col_name(item, path)))
            continue
        d = JsonObject(item, path)
        kind = choice(d, "type", DIMENSION_TYPES, "string")
        handling = d.get("multiValueHandling", "SORTED_ARRAY")
        if not isinstance(handling, str) or handling.upper() not in MULTI_VALUE_HANDLING:
            raise SpecError(d.at("multiValueHandling"),
                            f"must be one of {', '.join(MULTI_VALUE_HANDLING)}, not {handling!r}")
        if kind != "string" and d.value.get("multiValueHandling") is not None:
            raise SpecError(d.at("multiValueHandling"), f"applies to string dimensions, not {kind}")
        out.append(Dimension(col_name(d.get("name"), d.at("name")), kind, handling.upper()))
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
        m = JsonObject(item, f"{path}[{i}]")
        kind = choice(m, "type", tuple(METRIC_TYPES), None)
        name = col_name(m.get("name"), m.at("name"))
        fld = None
        if kind != "count":
            fld = col_name(m.get("fieldName"), m.at("fieldName"))
        if m.get("expression") is not None:
            raise SpecError(m.at("expression"), "is not supported")
        metric = Metric(kind, name, fld)
        if metric.first_last:
            time_col = m.get("timeColumn", "__time")
            if time_col != "__time":
                time_col = col_name(time_col, m.at("timeColumn"))
            metric = Metric(kind, name, fld, time_col,
                            int(m.int_("maxStringBytes", DEFAULT_MAX_STRING_BYTES) or 1)
                            if kind.startswith("string") else DEFAULT_MAX_STRING_BYTES)
        if kind in SKETCH_INPUT:
            metric = _sketch(m, metric)
        m.done()
        out.append(metric)
    return tuple(out)


def _power_of_two(m: JsonObject, key: str, default: int, lo: int, hi: int) -> int:
    value = m.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi \
            or value & (value - 1):
        raise SpecError(m.at(key), f"must be a power of 2 from {lo} to {hi}, not {value!r}")
    return value


def _sketch(m: JsonObject, metric: Metric) -> Metric:
    """A sketch aggregator's parameters (Druid's names and defaults); see rows.sketches."""
    try:
        import datasketches  # noqa: F401
    except ImportError:
        raise SpecError(m.at("type"), "needs the datasketches package (pip install datasketches)") from None
    m.get("shouldFinalize")  # query-time: whether results are estimates or sketches
    if metric.type == "HLLSketchBuild":
        lg_k = m.int_("lgK", 12, minimum=4)
        if lg_k is None or lg_k > 21:
            raise SpecError(m.at("lgK"), f"must be an integer from 4 to 21, not {lg_k!r}")
        tgt = choice(m, "tgtHllType", ("HLL_4", "HLL_6", "HLL_8"), "HLL_4")
        encoding = m.get("stringEncoding")
        if encoding != "UTF8":
            # Druid's default is UTF16LE (UTF-16 code units hashed); values here are hashed as
            # UTF-8 only, so the default is refused rather than silently replaced.
            said = "left out (Druid's default is UTF16LE)" if encoding is None else repr(encoding)
            raise SpecError(m.at("stringEncoding"), f"{said}: only \"UTF8\" is supported here "
                            "(values are hashed as UTF-8; UTF16LE hashes UTF-16 code units, "
                            "sketches that would not union with these); set it to \"UTF8\"")
        m.get("round")  # query-time rounding of the estimate: nothing to store
        return replace(metric, sketch_size=lg_k, hll_type=tgt or "HLL_4")
    if metric.type == "thetaSketch":
        size = _power_of_two(m, "size", 16384, 16, 1 << 26)
        if m.get("isInputThetaSketch", False):
            raise SpecError(m.at("isInputThetaSketch"), "is not supported (raw values only)")
        return replace(metric, sketch_size=size.bit_length() - 1)
    return replace(metric, sketch_size=_power_of_two(m, "k", 128, 2, 32768))


def _granularity(o: JsonObject, key: str, default: str) -> str:
    value = o.get(key, default)
    path = o.at(key)
    if isinstance(value, dict):
        g = JsonObject(value, path)
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
    return () if raw is None else tuple(sorted(interval_list(raw, path)))


