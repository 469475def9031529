"""Parsing of ``ioConfig`` and ``tuningConfig`` and the cross-field checks of a spec."""

from __future__ import annotations

from typing import Any

from shuffled.spark.spec.model import (DEFAULT_BYTES_IN_MEMORY, DEFAULT_PARTIAL_COMPRESSION,
                                        DEFAULT_SEGMENT_CODEC, PARTIAL_CODECS, SEGMENT_CODECS,
                                        IngestSpec, InputFormat, InputSource, PartitionsSpec)
from shuffled.spark.spec.base import IGNORED, SpecError, JsonObject, choice, col_name
from shuffled.spark.spec.flatten import parse_flatten


def io_config(o: JsonObject) -> dict[str, Any]:
    choice(o, "type", ("index_parallel",), "index_parallel")
    if o.value.get("firehose") is not None:
        raise SpecError(o.at("firehose"), "is not supported (use inputSource)")
    src = o.obj("inputSource")
    kind = choice(src, "type", ("local", "inline", "s3", "http"), None)
    if kind == "inline":
        data = src.str_("data", required=True)
        source = InputSource("inline", data=data)
    elif kind in ("s3", "http"):
        source = _remote_source(src, kind)
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
    fmt = input_format(o.obj("inputFormat"))
    if kind == "inline" and fmt.type == "parquet":
        raise SpecError(o.at("inputFormat.type"), "parquet cannot be given inline")
    append = o.bool_("appendToExisting", False)
    o.bool_("dropExisting", False)
    if o.value.get("dropExisting"):
        raise SpecError(o.at("dropExisting"), "is not supported")
    o.done()
    return {"input_source": source, "input_format": fmt, "append_to_existing": append}


def _uri_list(src: JsonObject, key: str, schemes: tuple[str, ...]) -> tuple[str, ...]:
    value = src.get(key, [])
    if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
        raise SpecError(src.at(key), "must be a list of URIs")
    for i, uri in enumerate(value):
        if not any(uri.startswith(f"{s}://") and len(uri) > len(s) + 3 for s in schemes):
            raise SpecError(f"{src.at(key)}[{i}]", f"{uri!r} is not a {' or '.join(schemes)} URI")
    return tuple(value)


def _remote_source(src: JsonObject, kind: str) -> InputSource:
    """Druid's ``s3`` (uris, prefixes, objects) and ``http`` (uris) input sources.
    Credentials come from the standard AWS environment and config files, never the spec."""
    if kind == "http":
        uris = _uri_list(src, "uris", ("http", "https"))
        if not uris:
            raise SpecError(src.at("uris"), "needs at least one URI")
        for key in ("httpAuthenticationUsername", "httpAuthenticationPassword"):
            if src.value.get(key) is not None:
                raise SpecError(src.at(key), "is not supported (no credentials in specs)")
        src.done()
        return InputSource("http", uris=uris)
    uris = _uri_list(src, "uris", ("s3",))
    prefixes = _uri_list(src, "prefixes", ("s3",))
    objects = src.get("objects", [])
    if not isinstance(objects, list):
        raise SpecError(src.at("objects"), "must be a list of {bucket, path}")
    for i, obj in enumerate(objects):
        if not isinstance(obj, dict) or not obj.get("bucket") or not obj.get("path"):
            raise SpecError(f"{src.at('objects')}[{i}]", "needs bucket and path")
    uris += tuple(f"s3://{o['bucket']}/{str(o['path']).lstrip('/')}" for o in objects)
    if sum(bool(x) for x in (src.value.get("uris"), prefixes, objects)) != 1:
        raise SpecError(src.path, "needs exactly one of uris, prefixes or objects (as Druid)")
    if src.value.get("properties") is not None:
        raise SpecError(src.at("properties"), "is not supported: credentials come from the "
                        "AWS environment (AWS_ACCESS_KEY_ID, ...), never the spec")
    flt = src.str_("filter") or src.str_("objectGlob")
    src.done()
    return InputSource("s3", filter=flt, uris=uris, prefixes=prefixes)


def input_format(f: JsonObject) -> InputFormat:
    kind = choice(f, "type", ("json", "csv", "parquet"), None)
    flatten = parse_flatten(f.obj("flattenSpec", required=False))
    if kind != "json" and (flatten.fields or not flatten.discover):
        raise SpecError(f.at("flattenSpec"), f"is supported for json input only, not {kind}")
    if kind == "json":
        f.done({"featureSpec", "keepNullColumns", "assumeNewlineDelimited", "useJsonNodeReader"})
        return InputFormat("json", flatten=flatten)
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


def parse_tuning(o: JsonObject) -> dict[str, Any]:
    choice(o, "type", ("index_parallel",), "index_parallel")
    legacy_rows = o.int_("maxRowsPerSegment", None)
    legacy_shards = o.int_("numShards", None)
    ps = o.obj("partitionsSpec", required=False)
    kind = choice(ps, "type", ("dynamic", "hashed", "range", "single_dim"),
                   "hashed" if legacy_shards else "dynamic")
    target = ps.int_("targetRowsPerSegment", None)
    max_rows = ps.int_("maxRowsPerSegment", None if kind != "dynamic" else legacy_rows)
    shards = ps.int_("numShards", legacy_shards if kind == "hashed" else None)
    if kind == "single_dim":
        dims: tuple[str, ...] = (col_name(ps.get("partitionDimension"), ps.at("partitionDimension")),)
    else:
        raw_dims = ps.get("partitionDimensions", o.value.get("partitionDimensions") or [])
        if not isinstance(raw_dims, list):
            raise SpecError(ps.at("partitionDimensions"), "must be a list of dimension names")
        dims = tuple(col_name(d, f"{ps.at('partitionDimensions')}[{i}]") for i, d in enumerate(raw_dims))
    if kind in ("range", "single_dim"):
        if shards is not None:
            raise SpecError(ps.at("numShards"), f"is not supported for {kind}")
        if not dims:
            raise SpecError(ps.at("partitionDimensions"), "is required for range partitioning")
    if kind == "hashed" and shards is not None and (target or max_rows):
        raise SpecError(ps.at("numShards"), "cannot be combined with targetRowsPerSegment/maxRowsPerSegment")
    if target and max_rows and kind != "dynamic":
        raise SpecError(ps.at("targetRowsPerSegment"), "cannot be combined with maxRowsPerSegment")
    ps.bool_("assumeGrouped", False)  # Druid's sizing hint: ignored (docs/spec-coverage.md)
    ps.done({"maxTotalRows", "partitionFunction"})
    if ps.value.get("partitionFunction") is not None:
        # Druid's only function, murmur3_32_abs, hashes its serialized group key with
        # Guava's murmur3_32; rows here are partitioned by Spark's hash() (the shardSpec
        # says spark_murmur3_32). Asking for Druid's by name must not silently get ours.
        raise SpecError(ps.at("partitionFunction"), f"{ps.value['partitionFunction']!r} is not "
                        "implemented: hashed partitions here use Spark's hash() (spark_murmur3_32 "
                        "in the shardSpec, see docs/differences-from-druid.md); leave "
                        "partitionFunction out")
    goal = target or max_rows or 5_000_000
    partitions = PartitionsSpec(kind, shards, goal, max_rows, dims)
    out = {
        "partitions": partitions,
        "force_guaranteed_rollup": o.bool_("forceGuaranteedRollup", False),
        "max_concurrent_subtasks": o.int_("maxNumConcurrentSubTasks", 1),
        "total_merge_tasks": o.int_("totalNumMergeTasks", None),  # None: sized at run time
        # Druid's: the task fails once unparseable + processedWithError rows exceed it
        "max_parse_exceptions": o.int_("maxParseExceptions", 2**31 - 1, minimum=0),
        "log_parse_exceptions": o.bool_("logParseExceptions", False),
        "max_rows_in_memory": max(1000, o.int_("maxRowsInMemory", 1_000_000) or 1_000_000),
        "max_saved_parse_exceptions": o.int_("maxSavedParseExceptions", 20, minimum=0),
        "max_bytes_in_memory": _bytes_in_memory(o.int_("maxBytesInMemory", 0, minimum=-1)),
        # ours, not Druid's: how phase 1 compresses partials on the wire and on disk
        "partial_compression": choice(o, "partialCompression", PARTIAL_CODECS,
                                      DEFAULT_PARTIAL_COMPRESSION),
        # ours: how many daemons hold each partial, and how long a read waits for a daemon
        # that does not answer (a restart) before its data counts as lost (docs/failover.md)
        "shuffle_replicas": o.int_("shuffleReplicas", 1),
        "shuffle_retry_seconds": o.int_("shuffleRetrySeconds", 30),
        # ours: "deep" counts a daemon's seal only once its copy is in deep storage, so a
        # daemon lost after the seal costs no recompute (docs/deep-storage.md)
        "shuffle_durability": choice(o, "shuffleDurability", DURABILITIES, "local"),
        # ours: per-task limits on each daemon (tighter than the daemons' own, never
        # looser; 0: none) and how long the per-task tokens minted for it live
        "shuffle_quota_bytes": o.int_("shuffleQuotaBytes", 0, minimum=0),
        "shuffle_quota_partials": o.int_("shuffleQuotaPartials", 0, minimum=0),
        "shuffle_token_seconds": o.int_("shuffleTokenSeconds", 172_800, minimum=60),
    }
    out.update(_index_spec(JsonObject(o.get("indexSpec"), o.at("indexSpec"), required=False)))
    o.done(IGNORED["tuningConfig"] - {"indexSpec"})
    return out


DURABILITIES = ("local", "deep")


def _index_spec(o: JsonObject) -> dict[str, Any]:
    """Druid's indexSpec: its column compressions become the segments' Parquet codecs (a
    small segment's ZSTD context costs ~0.3 ms more per file than LZ4, measured); the rest
    of it only tunes Druid's own segment format and is ignored."""
    names = tuple(SEGMENT_CODECS) + ("lzf",)
    codecs = {}
    for key, field in (("dimensionCompression", "dimension_codec"),
                       ("metricCompression", "metric_codec")):
        value = choice(o, key, names, DEFAULT_SEGMENT_CODEC)
        if value == "lzf":
            raise SpecError(o.at(key), "'lzf' has no Parquet codec here; use lz4 (Druid's "
                            "default), zstd or uncompressed")
        codecs[field] = SEGMENT_CODECS[value]
    o.done({"bitmap", "stringDictionaryEncoding", "longEncoding", "complexMetricCompression",
            "jsonCompression", "segmentLoader", "autoColumnFormatSpec"})
    return codecs


def _bytes_in_memory(value: int | None) -> int:
    """Druid's maxBytesInMemory: 0 (or absent) is the default, -1 lifts the bound."""
    if not value:
        return DEFAULT_BYTES_IN_MEMORY
    return 0 if value < 0 else max(value, 1 << 16)


def check_consistency(s: IngestSpec) -> None:
    ps = "$.spec.tuningConfig.partitionsSpec"
    if s.append_to_existing and s.force_guaranteed_rollup:
        # Druid's own check (IndexTask / ParallelIndexSupervisorTask), with its words.
        raise SpecError("$.spec.ioConfig.appendToExisting", "Perfect rollup cannot be guaranteed "
                        "when appending to existing dataSources (forceGuaranteedRollup is true; "
                        "append with dynamic partitioning, or set appendToExisting to false)")
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
        for dim in s.dimensions:
            if dim.name in s.partitions.dimensions and dim.type != "string":
                raise SpecError(f"{ps}.partitionDimensions", f"{dim.name!r} is not a string dimension")
    if s.input_format.type == "csv" and s.input_format.columns:
        missing = [c for c in s.input_fields if c not in s.input_format.columns]
        if missing:
            raise SpecError("$.spec.ioConfig.inputFormat.columns", f"does not list {missing}")
