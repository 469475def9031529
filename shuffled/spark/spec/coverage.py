"""Which Druid ``index_parallel`` spec fields (and values) the parser supports, ignores or refuses.

One :class:`Field` per row of docs/spec-coverage.md; tests/spark/spec/test_spec_coverage.py
checks the page's table equals :data:`COVERAGE` and *probes the parser with every row* (the
row's value set at its path in a valid spec: ``supported``/``ignored`` must parse,
``refused`` must raise SpecError at that path), so neither the page nor this table can drift
from the parser.

``python -m shuffled.spark.spec.coverage`` prints the table for the page. To add rows (new
aggregators, fields), append :class:`Field` entries; ``extra`` sets other paths a probe needs
(e.g. ``forceGuaranteedRollup`` for hashed partitioning) and ``parent`` fields next to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from shuffled.spark.spec.base import IGNORED

ANY = "<any>"  # the row is about the field, whatever its (valid) value


@dataclass(frozen=True)
class Field:
    """A field path (``[]`` = an element of a list) and a value, with its status and a note."""

    path: str
    value: Any
    status: str  # supported | ignored | refused
    note: str = ""
    parent: dict[str, Any] | None = None  # replaces the object holding the field
    extra: dict[str, Any] = field(default_factory=dict)

    def cell(self) -> str:
        return "" if self.value == ANY else f"`{json.dumps(self.value)}`"


DS = "spec.dataSchema"
DIM = f"{DS}.dimensionsSpec"
MET = f"{DS}.metricsSpec[]"
GRAN = f"{DS}.granularitySpec"
TS = f"{DS}.transformSpec"
EXPR = f"{TS}.transforms[].expression"
FLT = f"{TS}.filter"
IO = "spec.ioConfig"
SRC = f"{IO}.inputSource"
FMT = f"{IO}.inputFormat"
FLAT = f"{FMT}.flattenSpec"
TUN = "spec.tuningConfig"
PS = f"{TUN}.partitionsSpec"
_HASHED = {f"{TUN}.forceGuaranteedRollup": True}
_UTF8 = {"stringEncoding": "UTF8"}  # HLLSketchBuild: Druid's default (UTF16LE) is refused


def _rows() -> list[Field]:
    S, I, R = "supported", "ignored", "refused"
    rows = [
        Field("type", "index_parallel", S), Field("type", "index", R, "only index_parallel"),
        Field("id", "task_1", S, "the task id (shuffle data is kept under it)"),
        Field("context", {}, I), Field("resource", {}, I), Field("dataSource", "x", I),
        Field("groupId", "g", I),
        Field(f"{DS}.dataSource", "wiki", S),
        Field(f"{DS}.timestampSpec.column", "ts", S),
        *[Field(f"{DS}.timestampSpec.format", f, S) for f in ("iso", "millis", "posix", "auto", "micro", "nano")],
        Field(f"{DS}.timestampSpec.format", "yyyy-MM-dd", R, "Joda patterns: use a timestamp_parse transform on __time"),
        Field(f"{DS}.timestampSpec.missingValue", "2018-01-01T00:00:00Z", S),
        Field(f"{DIM}.dimensions", ANY, S, "schema discovery (an empty list) is refused"),
        *[Field(f"{DIM}.dimensions[].type", t, S, parent={"name": "animal"}) for t in ("string", "long", "float", "double")],
        Field(f"{DIM}.dimensions[].type", "json", R, parent={"name": "animal"}),
        Field(f"{DIM}.dimensions[].multiValueHandling", "SORTED_ARRAY", S,
              "the default: values sorted, duplicates kept (see Multi-value dimensions)", parent={"name": "animal"}),
        Field(f"{DIM}.dimensions[].multiValueHandling", "SORTED_SET", S, "sorted, duplicates dropped",
              parent={"name": "animal"}),
        Field(f"{DIM}.dimensions[].multiValueHandling", "array", S, "as they come; case-insensitive (as Druid)",
              parent={"name": "animal"}),
        Field(f"{DIM}.dimensions[].multiValueHandling", "SORTED", R, parent={"name": "animal"}),
        Field(f"{DIM}.dimensions[].multiValueHandling", "ARRAY", R, "on a long, float or double dimension",
              parent={"name": "number", "type": "long"}),
        Field(f"{DIM}.dimensions[].createBitmapIndex", False, I, parent={"name": "animal"}),
        Field(f"{DIM}.dimensionExclusions", ["x"], R), Field(f"{DIM}.spatialDimensions", [{"dimName": "x"}], R),
        Field(f"{DIM}.includeAllDimensions", True, R), Field(f"{DIM}.useSchemaDiscovery", True, R),
        Field(f"{DIM}.forceSegmentSortByTime", True, I),
        Field(f"{MET}.type", "count", S, parent={"name": "m"}),
        *[Field(f"{MET}.type", t, S, parent={"name": "m", "fieldName": "number"}) for t in (
            "longSum", "doubleSum", "floatSum", "longMin", "longMax", "doubleMin", "doubleMax",
            "floatMin", "floatMax")],
        *[Field(f"{MET}.type", t, S, "" if t != "longFirst" else "see First/last aggregators",
                parent={"name": "m", "fieldName": "number"}) for t in (
            "longFirst", "longLast", "doubleFirst", "doubleLast", "floatFirst", "floatLast", "stringFirst",
            "stringLast")],
        Field(f"{MET}.timeColumn", "number", S, "first/last: default __time (the row's timestamp)",
              parent={"type": "longLast", "name": "m", "fieldName": "number"}),
        Field(f"{MET}.maxStringBytes", 16, S, "stringFirst/stringLast: default 1024, counted in characters as Druid's chop",
              parent={"type": "stringFirst", "name": "m", "fieldName": "animal"}),
        Field(f"{MET}.maxStringBytes", 1, R, "string first/last only",
              parent={"type": "longFirst", "name": "m", "fieldName": "number"}),
        *[Field(f"{MET}.type", t, S, note, parent={"name": "m", "fieldName": "number", **extra})
          for t, note, extra in (("HLLSketchBuild", "with stringEncoding UTF8; see Sketch metrics", _UTF8),
                                 ("thetaSketch", "", {}), ("quantilesDoublesSketch", "", {}))],
        Field(f"{MET}.lgK", 14, S, "HLL: 4 to 21, default 12", parent={"type": "HLLSketchBuild", "name": "m",
                                                                       "fieldName": "animal", **_UTF8}),
        *[Field(f"{MET}.tgtHllType", t, S, parent={"type": "HLLSketchBuild", "name": "m", "fieldName": "animal",
                                                   **_UTF8})
          for t in ("HLL_4", "HLL_6", "HLL_8")],
        Field(f"{MET}.stringEncoding", "UTF8", S, "values hashed as UTF-8", parent={
            "type": "HLLSketchBuild", "name": "m", "fieldName": "animal"}),
        Field(f"{MET}.stringEncoding", "UTF16LE", R, "Druid's default, so leaving the field out is refused "
              "too; see Sketch metrics", parent={
            "type": "HLLSketchBuild", "name": "m", "fieldName": "animal"}),
        *[Field(f"{MET}.{k}", True, I, "query-time", parent={"type": "HLLSketchBuild", "name": "m",
                                                            "fieldName": "animal", **_UTF8})
          for k in ("round", "shouldFinalize")],
        Field(f"{MET}.size", 4096, S, "theta: a power of 2, default 16384", parent={
            "type": "thetaSketch", "name": "m", "fieldName": "animal"}),
        Field(f"{MET}.size", 1000, R, parent={"type": "thetaSketch", "name": "m", "fieldName": "animal"}),
        Field(f"{MET}.isInputThetaSketch", True, R, "raw values only", parent={
            "type": "thetaSketch", "name": "m", "fieldName": "animal"}),
        Field(f"{MET}.k", 256, S, "quantiles: a power of 2 from 2 to 32768, default 128", parent={
            "type": "quantilesDoublesSketch", "name": "m", "fieldName": "number"}),
        *[Field(f"{MET}.type", t, R, parent={"name": "m", "fieldName": "number"}) for t in (
            "hyperUnique", "cardinality", "javascript", "HLLSketchMerge", "quantilesDoublesSketchMerge")],
        Field(f"{MET}.expression", "number * 2", R, "use a transform", parent={"type": "longSum", "name": "m", "fieldName": "number"}),
        Field(f"{GRAN}.type", "uniform", S), Field(f"{GRAN}.type", "arbitrary", R),
        Field(f"{GRAN}.segmentGranularity", "hour", S, "none is refused"),
        Field(f"{GRAN}.queryGranularity", "minute", S), Field(f"{GRAN}.queryGranularity", {"type": "period", "period": "PT5M"}, R),
        Field(f"{GRAN}.rollup", False, S), Field(f"{GRAN}.intervals", ["2018-01-01/2018-01-03"], S),
        Field(f"{DS}.parser", {"type": "string"}, R, "legacy; use ioConfig.inputFormat"),
        Field(f"{TS}.transforms[].type", "expression", S, parent={"name": "x", "expression": "1"}),
        Field(f"{TS}.transforms[].name", "__time", S, "a transform may replace an input field or __time",
              parent={"expression": "__time"}),
    ]
    rows += [Field(EXPR, sample, S, note, parent={"type": "expression", "name": "x"})
             for sample, note in _FUNCTION_SAMPLES]
    rows += [Field(EXPR, sample, R, note, parent={"type": "expression", "name": "x"})
             for sample, note in _REFUSED_EXPRESSIONS]
    rows += [Field(f"{FLT}.type", kind, S, note, parent=parent) for kind, parent, note in _FILTER_SAMPLES]
    rows += [Field(f"{FLT}.type", kind, R, parent={"dimension": "animal"}) for kind in (
        "search", "javascript", "spatial", "columnComparison", "arrayContainsElement")]
    rows += [
        Field(f"{FLT}.extractionFn", {"type": "upper"}, R, parent={"type": "selector", "dimension": "animal", "value": "x"}),
        Field(f"{FLT}.filterTuning", {"useBitmapIndex": False}, I,
              parent={"type": "selector", "dimension": "animal", "value": "x"}),
        Field(f"{FLT}.ordering", "alphanumeric", R, parent={"type": "bound", "dimension": "animal"}),
        Field(f"{IO}.type", "index_parallel", S), Field(f"{IO}.firehose", {"type": "local"}, R),
        *[Field(f"{SRC}.type", t, S, parent=p) for t, p in (
            ("local", {"baseDir": "d", "filter": "*.json"}), ("inline", {"data": "{}"}))],
        Field(f"{SRC}.type", "s3", S, "uris, prefixes (+ filter) or objects; credentials from the AWS environment",
              parent={"uris": ["s3://bucket/a.json"]}),
        Field(f"{SRC}.type", "http", S, "uris; no credentials in specs", parent={"uris": ["http://host/a.json"]}),
        Field(f"{SRC}.properties", {"accessKeyId": "x"}, R, "credentials in specs",
              parent={"type": "s3", "uris": ["s3://bucket/a.json"]}),
        *[Field(f"{SRC}.type", t, R) for t in ("hdfs", "google", "azure", "druid", "combining", "sql")],
        Field(f"{SRC}.files", ["a.json"], S, parent={"type": "local"}),
        *[Field(f"{FMT}.type", t, S) for t in ("json", "parquet")],
        Field(f"{FMT}.type", "csv", S, parent={"columns": ["timestamp", "animal", "location", "number"]}),
        *[Field(f"{FMT}.type", t, R) for t in ("tsv", "avro_ocf", "orc", "protobuf", "regex", "kafka")],
        Field(f"{FLAT}.useFieldDiscovery", False, S, "false: only the listed fields exist"),
        *[Field(f"{FLAT}.fields[].type", t, S, note, parent={"name": "x", **p}) for t, p, note in (
            ("root", {}, "expr (the root key) defaults to name"),
            ("path", {"expr": "$.a['b c'][0]"}, "JSONPath keys and indices, via Spark's get_json_object"),
            ("jq", {"expr": '.a."b c"[0]'}, "jq paths: keys and indices only"),
            ("tree", {"nodes": ["a", "b"]}, ""))],
        *[Field(f"{FLAT}.fields[].expr", e, R, note, parent={"type": t, "name": "x"}) for t, e, note in (
            ("path", "$..a", "deep scan, wildcards, filters, slices, unions, functions are refused"),
            ("path", "$.a[*]", ""), ("path", "$.hello.sum()", ""),
            ("jq", ".hello | sum", "pipes, iteration and jq functions are refused"))],
        Field(f"{FMT}.flattenSpec", {"fields": ["a"]}, R, "json input only", parent={"type": "parquet"}),
        *[Field(f"{FMT}.{k}", True, I) for k in ("keepNullColumns", "assumeNewlineDelimited", "useJsonNodeReader")],
        Field(f"{FMT}.featureSpec", {}, I),
        Field(f"{FMT}.binaryAsString", True, I, parent={"type": "parquet"}),
        *[Field(f"{FMT}.{k}", v, S, note, parent={"type": "csv", "columns": ["timestamp", "animal", "location",
                                                                             "number"]})
          for k, v, note in (("columns", ["timestamp", "animal", "location", "number"], ""),
                             ("findColumnsFromHeader", True, "each file's first line after skipHeaderRows"),
                             ("hasHeaderRow", True, "legacy name of findColumnsFromHeader"),
                             ("skipHeaderRows", 1, "each file's first lines, never counted as rows; "
                                                   ".gz/.bz2/.zst/.xz files too"))],
        Field(f"{FMT}.listDelimiter", "|", I, "CSV values are never split into multi-values",
              parent={"type": "csv", "columns": ["timestamp", "animal", "location", "number"]}),
        Field(f"{IO}.appendToExisting", True, S, "with dynamic partitioning (best-effort rollup in Druid)"),
        Field(f"{IO}.appendToExisting", True, R, "with forceGuaranteedRollup: as Druid, \"Perfect rollup cannot be "
              "guaranteed when appending to existing dataSources\"",
              extra={**_HASHED, f"{PS}": {"type": "hashed", "numShards": 2}}),
        Field(f"{IO}.dropExisting", True, R),
        Field(f"{TUN}.type", "index_parallel", S),
        Field(f"{PS}.type", "dynamic", S),
        Field(f"{PS}.type", "hashed", S, extra=_HASHED),
        Field(f"{PS}.type", "range", S, parent={"partitionDimensions": ["animal"]}, extra=_HASHED),
        Field(f"{PS}.type", "single_dim", S, parent={"partitionDimension": "animal"}, extra=_HASHED),
        Field(f"{PS}.targetRowsPerSegment", 1000, S, parent={"type": "hashed"}, extra=_HASHED),
        Field(f"{PS}.maxRowsPerSegment", 1000, S),
        Field(f"{PS}.numShards", 2, S, parent={"type": "hashed"}, extra=_HASHED),
        Field(f"{PS}.partitionDimensions", ["animal"], S, parent={"type": "hashed"}, extra=_HASHED),
        Field(f"{PS}.partitionDimension", "animal", S, parent={"type": "single_dim"}, extra=_HASHED),
        Field(f"{PS}.assumeGrouped", True, I, "a hint to Druid's partition sizing; partitions are sized from "
              "the rolled-up keys here", parent={"type": "hashed"}, extra=_HASHED),
        Field(f"{PS}.partitionFunction", "murmur3_32_abs", R, "Druid's hash is not implemented: partitions use "
              "Spark's hash() (spark_murmur3_32 in the shardSpec); leave it out", parent={"type": "hashed"},
              extra=_HASHED),
        Field(f"{PS}.maxTotalRows", 1000, I),
        Field(f"{TUN}.forceGuaranteedRollup", True, S, parent={"partitionsSpec": {"type": "hashed"}}),
        Field(f"{TUN}.maxRowsPerSegment", 1000, S, "legacy: dynamic partitioning's maxRowsPerSegment"),
        Field(f"{TUN}.numShards", 2, S, "legacy: hashed partitioning's numShards", extra=_HASHED),
        Field(f"{TUN}.partitionDimensions", ["animal"], S, "legacy: partitionsSpec.partitionDimensions",
              extra={**_HASHED, f"{TUN}.numShards": 2}),
        *[Field(f"{TUN}.{k}", v, S) for k, v in (
            ("maxNumConcurrentSubTasks", 2), ("totalNumMergeTasks", 2), ("maxParseExceptions", 0),
            ("maxRowsInMemory", 1000), ("maxSavedParseExceptions", 5))],
        Field(f"{TUN}.logParseExceptions", True, S, "logs each parse exception (unparseable or processedWithError)"),
        Field(f"{TUN}.maxBytesInMemory", 1 << 20, S, "a task's memory budget (Druid's meaning: 0 default, -1 unbounded)"),
        *[Field(f"{TUN}.partialCompression", c, S, "ours: Arrow IPC compression of partials" if c == "lz4" else "")
          for c in ("lz4", "zstd", "none")],
        Field(f"{TUN}.shuffleReplicas", 2, S, "ours: daemons each partial is written to (docs/failover.md)"),
        Field(f"{TUN}.shuffleRetrySeconds", 30, S, "ours: how long a read waits for a daemon that does not answer"),
        *[Field(f"{TUN}.shuffleDurability", d, S, "ours: deep = the seal counts once the daemons' copies are in deep storage (docs/deep-storage.md)" if d == "deep" else "")
          for d in ("local", "deep")],
        Field(f"{TUN}.shuffleQuotaBytes", 1 << 30, S, "ours: most bytes the task may hold on each daemon (docs/security.md)"),
        Field(f"{TUN}.shuffleQuotaPartials", 100000, S, "ours: most partial segments the task may hold on each daemon"),
        Field(f"{TUN}.shuffleTokenSeconds", 3600, S, "ours: lifetime of the per-task tokens minted with --signing-secret-file"),
        *[Field(f"{TUN}.indexSpec.{k}", c, S,
                f"the Parquet codec of the segments' {what} columns (lz4: Druid's default)"
                if c == "lz4" else "") for k, what in (
            ("dimensionCompression", "dimension"), ("metricCompression", "metric and __time"))
          for c in ("lz4", "zstd", "uncompressed")],
        *[Field(f"{TUN}.indexSpec.{k}", "lzf", R, "no Parquet codec")
          for k in ("dimensionCompression", "metricCompression")],
        *[Field(f"{TUN}.indexSpec.{k}", v, I) for k, v in (
            ("bitmap", {"type": "roaring"}), ("longEncoding", "longs"),
            ("stringDictionaryEncoding", {"type": "utf8"}))],
    ]
    done = {r.path[len(TUN) + 1:].split(".")[0] for r in rows if r.path.startswith(f"{TUN}.")}
    rows += [Field(f"{TUN}.{k}", _IGNORED_SAMPLES.get(k, 1), I) for k in sorted(IGNORED["tuningConfig"] - done)]
    return rows


_FUNCTION_SAMPLES: list[tuple[str, str]] = [
    ("number + 1 - 2 * 3 / 4 % 5 ^ 2", "arithmetic: LONG when both sides are LONG, else DOUBLE; "
     "/ and % by zero give null (LONG) or Java's Infinity/NaN (DOUBLE); LONG overflow gives null"),
    ("number > 1 && animal == 'x' || !(number <= 2) && number != 3 && number < 4 && number >= 0",
     "comparison and logic: 1/0 (strict booleans), three-valued with nulls; && and || at one level"),
    ("concat('super-', animal)", "null if any argument is null"),
    ("substring(animal, 0, 3)", "0-based; length -1 = to the end; null past the end"),
    ("lower(animal)", ""), ("upper(animal)", ""), ("strlen(animal)", "code points"),
    ("trim(animal)", "spaces"), ("replace(animal, 'a', 'b')", "literal, every occurrence"),
    ("nvl(animal, 'none')", ""), ("isnull(animal)", ""), ("notnull(animal)", ""), ("abs(number)", ""),
    ("if(number > 1, 'a', 'b')", ""),
    ("case_searched(number > 1, 'a', number > 0, 'b', 'c')", ""),
    ("case_simple(animal, 'lion', 1, 'snake', 2, 0)", ""),
    ("like(animal, 'sn%', '\\\\')", "whole value; optional escape"),
    ("regexp_like(animal, '^s')", "Java regex, found anywhere"),
    ("regexp_extract(animal, '(s)n', 1)", "null when nothing matches"),
    ("timestamp_floor(__time, 'PT15M')", "single-field ISO periods; UTC; origin (millis) for weeks or less"),
    ("timestamp_parse(animal, 'yyyy-MM-dd HH:mm')", "no pattern: ISO-8601; Joda letters yMdHhkmsSaE only"),
    ("timestamp_format(__time, 'yyyy-MM-dd')", "no pattern: yyyy-MM-ddTHH:mm:ss.SSSZ"),
    ("cast(number, 'LONG')", "LONG, DOUBLE, FLOAT (as DOUBLE), STRING"),
]

_REFUSED_EXPRESSIONS: list[tuple[str, str]] = [
    ("json_value(animal, '$.a')", "every function not listed above is refused by name"),
    ("array_length(animal)", "array functions"), ("[1, 2]", "array literals"),
    ("timestamp_floor(__time, 'P1D', null, 'Asia/Tokyo')", "time zones other than UTC"),
    ("timestamp_floor(__time, 'PT1H30M')", "compound periods"),
    ("timestamp_parse(animal, 'xxxx')", "Joda pattern letters outside yMdHhkmsSaE"),
]

_FILTER_SAMPLES: list[tuple[str, dict[str, Any], str]] = [
    ("selector", {"dimension": "animal", "value": "lion"}, "value null matches null; numbers compare numerically"),
    ("equality", {"column": "number", "matchValueType": "LONG", "matchValue": 3}, "STRING, LONG, DOUBLE, FLOAT"),
    ("in", {"dimension": "animal", "values": ["lion", None]}, ""),
    ("bound", {"dimension": "number", "lower": "1", "upperStrict": True, "upper": "9", "ordering": "numeric"},
     "lexicographic or numeric ordering"),
    ("range", {"column": "number", "matchValueType": "DOUBLE", "lower": 1}, ""),
    ("like", {"dimension": "animal", "pattern": "li%"}, ""),
    ("regex", {"dimension": "animal", "pattern": "^l"}, "Java regex, found anywhere"),
    ("null", {"column": "animal"}, ""),
    ("interval", {"dimension": "__time", "intervals": ["2018-01-01/2018-01-02"]}, ""),
    ("true", {}, ""), ("false", {}, ""),
    ("and", {"fields": [{"type": "true"}]}, ""), ("or", {"fields": [{"type": "true"}]}, ""),
    ("not", {"field": {"type": "true"}}, "not of unknown (null) stays unknown: the row is dropped"),
    ("expression", {"expression": "number > 1"}, ""),
]

_IGNORED_SAMPLES: dict[str, Any] = {
    "indexSpec": {}, "indexSpecForIntermediatePersists": {}, "segmentWriteOutMediumFactory": {},
    "splitHintSpec": {}, "reportParseExceptions": False, "logParseExceptions": False,
    "skipBytesInMemoryOverheadCheck": False, "partitionDimensions": [],
}


COVERAGE: tuple[Field, ...] = tuple(_rows())


def table() -> str:
    """The markdown table of docs/spec-coverage.md."""
    lines = ["| field | value | status | notes |", "|---|---|---|---|"]
    for r in COVERAGE:
        note = r.note.replace("|", "\\|")
        value = r.cell().replace("|", "\\|")
        lines.append(f"| `{r.path}` | {value} | {r.status} | {note} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(table())
