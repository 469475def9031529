"""Input: resolve the spec's files (before Spark starts) and read them as a DataFrame.

JSON lines and CSV are read as text lines and parsed in the JVM (``from_json``/``from_csv``
in PERMISSIVE mode), so every bad line is kept, not dropped, and can be reported with its
file and line. Each field is read as a string; typing happens in :mod:`shuffled.spark.phase1.jvm.prepare`. The
result has the input fields plus ``__file``, ``__line`` (known for inline data and Parquet;
resolved on the driver for the few bad text lines), ``__raw`` and ``__corrupt``; Parquet
input has no ``__file`` column (see :func:`_parquet`).
"""

from __future__ import annotations

import fnmatch
import functools
import os
from collections.abc import Iterable
from typing import Any


from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shuffled.spark.fs import compressed, remote
from shuffled.spark.phase1.native.text.plan import csv_columns
from shuffled.spark.phase1.native.text.blocks import file_uri
from shuffled.spark.phase1.columns import json_fields
from shuffled.spark.phase1.jvm.multivalue import json_arrays
from shuffled.spark.spec.model import IngestSpec
from shuffled.spark.spec.parse import SpecError

SRC = "$.spec.ioConfig.inputSource"
_CORRUPT = "__corrupt_record"


def resolve_files(spec: IngestSpec, cwd: str | None = None) -> list[str]:
    """Absolute paths of the input files, sorted; SpecError if there are none.

    ``baseDir`` is walked recursively and ``filter`` (a wildcard, as Druid's) is matched
    against file names; ``files`` are taken as listed. Relative paths are relative to ``cwd``.
    """
    src = spec.input_source
    if src.type == "inline":
        return []
    if src.type in ("s3", "http"):
        return _remote_files(spec)
    root = cwd or os.getcwd()
    out: list[str] = []
    for i, name in enumerate(src.files):
        path = os.path.abspath(os.path.join(root, name))
        if not os.path.isfile(path):
            raise SpecError(f"{SRC}.files[{i}]", f"{path} is not a readable file")
        out.append(path)
    if src.base_dir:
        base = os.path.abspath(os.path.join(root, src.base_dir))
        if not os.path.isdir(base):
            raise SpecError(f"{SRC}.baseDir", f"{base} is not a directory")
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for fn in sorted(filenames):
                if fnmatch.fnmatchcase(fn, src.filter or "*") and not fn.startswith("."):
                    out.append(os.path.join(dirpath, fn))
        if not out:
            raise SpecError(f"{SRC}.filter", f"no file under {base} matches {src.filter!r}")
    _refuse_compression(out, spec)
    return sorted(dict.fromkeys(out))


def _refuse_compression(files: list[str], spec: IngestSpec) -> None:
    """Druid decompresses ``.zip`` and ``.sz`` input too; read as text here it would be
    garbage, so such a file is refused by name (``.gz``, ``.bz2``, ``.zst``, ``.xz`` are
    read, see :mod:`shuffled.spark.fs.compressed`)."""
    if spec.input_format.type == "parquet":
        return
    for path in files:
        ext = compressed.refused(path)
        if ext:
            raise SpecError(SRC, f"{path}: {ext} input is not supported (compressed input: "
                            f"{', '.join(compressed.CODECS)})")


def _remote_files(spec: IngestSpec) -> list[str]:
    """The object-store URIs to read: ``uris`` as listed (S3 ones checked to exist) and
    every object under each ``prefixes`` entry matching ``filter``."""
    src = spec.input_source
    out = list(src.uris)
    try:
        if src.type == "s3":
            for i, uri in enumerate(src.uris):
                if not remote.exists(uri):
                    raise SpecError(f"{SRC}.uris[{i}]", f"{uri} is not an object in the store")
            for i, prefix in enumerate(src.prefixes):
                found = remote.list_s3(prefix, src.filter)
                if not found:
                    raise SpecError(f"{SRC}.prefixes[{i}]",
                                    f"no object under {prefix} matches {src.filter or '*'!r}")
                out.extend(found)
    except OSError as exc:  # the store refused or is unreachable: say which and why
        raise SpecError(SRC, f"cannot list the input in the object store: {exc} (credentials "
                        "and endpoint come from AWS_* environment variables)") from exc
    _refuse_compression(out, spec)
    return sorted(dict.fromkeys(out))


def input_bytes(spec: IngestSpec, files: list[str]) -> int:
    """The input's bytes as Druid's processedBytes counts them: inline data's UTF-8 bytes,
    each file's size, a compressed text file's bytes after decompression (read once more)."""
    if spec.input_source.type == "inline":
        return len((spec.input_source.data or "").encode())
    if spec.input_format.type == "parquet":
        return sum(remote.size(f) for f in files)
    return sum(remote.text_bytes(f) for f in files)


def _text_lines(spark: SparkSession, spec: IngestSpec, files: list[str]) -> DataFrame:
    skip = spec.input_format.skip_header_rows if spec.input_format.type == "csv" else 0
    if spec.input_source.type == "inline":
        lines = (spec.input_source.data or "").splitlines()
        rows = [(line, "inline", i + 1) for i, line in enumerate(lines) if i >= skip]
        schema = "value string, __file string, __line bigint"
        return spark.createDataFrame(rows, schema)
    if skip or any(remote.is_remote(f) or compressed.codec(f) for f in files):
        # Object stores are read on the executors through pyarrow.fs / HTTP (Spark's own
        # s3a needs hadoop-aws, which pyspark does not ship), compressed files through
        # their codec (Hadoop's zstd needs native libraries), and files whose first lines
        # are skipped (skipHeaderRows) by line number: one task per file, lines numbered as
        # they come, then parsed by Spark as local files are.
        rdd = spark.sparkContext.parallelize(files, len(files)).flatMap(
            functools.partial(_numbered_lines, skip=skip))
        return spark.createDataFrame(rdd, "value string, __file string, __line bigint")
    df = spark.read.text(files)
    return df.select("value", F.col("_metadata.file_path").alias("__file"),
                     F.lit(None).cast("bigint").alias("__line"))


def _numbered_lines(uri: str, skip: int = 0) -> Iterable[tuple[str, str, int]]:
    """The lines of ``uri`` after its first ``skip``, numbered, with the file's name as
    the JVM reader reports it."""
    name = file_uri(uri)
    for n, line in enumerate(remote.read_lines(uri), 1):
        if n > skip:
            yield line, name, n


def load_input(spark: SparkSession, spec: IngestSpec, files: list[str]) -> DataFrame:
    """The input rows: every input field (string, or Parquet's own type) + bookkeeping."""
    fields = list(spec.input_fields)
    if spec.input_format.type == "parquet":
        return _parquet(spark, files, fields)
    lines = _text_lines(spark, spec, files)
    lines = lines.where(F.length(F.trim("value")) > 0)
    flat = spec.input_format.flatten
    roots = _root_fields(spec, fields)
    schema = T.StructType([T.StructField(f, T.StringType()) for f in roots]
                          + [T.StructField(_CORRUPT, T.StringType())])
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    if spec.input_format.type == "json":
        parsed = F.from_json("value", schema, opts)
    else:
        columns, headers = csv_columns(spec, files)
        if headers:
            lines = lines.where(~F.col("value").isin(list(headers)))
        ddl = ", ".join(f"`{c}` STRING" for c in [*columns, _CORRUPT])
        opts["sep"] = spec.input_format.delimiter
        parsed = F.from_csv(F.col("value"), F.lit(ddl), opts)
    df = lines.select(parsed.alias("__p"), "value", "__file", "__line")
    cols: list[Column] = []
    for f in fields:
        found = flat.get(f)
        nested = found is not None and (len(found.steps) > 1 or isinstance(found.steps[0], int))
        if found is not None and nested:
            # Spark's own JSONPath evaluation, in the JVM (see spec.flatten).
            cols.append(F.get_json_object(F.col("value"), found.json_path).alias(f))
        elif found is not None:
            cols.append(F.col("__p").getField(str(found.steps[0])).alias(f))
        elif flat.discover or spec.input_format.type != "json":
            cols.append(F.col("__p").getField(f).alias(f))
        else:  # useFieldDiscovery false: only the listed fields exist
            cols.append(F.lit(None).cast("string").alias(f))
    # JSON arrays of string dimensions beside their text: multi-values (phase1/jvm/multivalue.py).
    arrays = json_arrays(F.col("value"), F.col("__p"), json_fields(spec))
    corrupt = F.col("__p").isNull() | F.col("__p").getField(_CORRUPT).isNotNull()
    return df.select(*cols, *arrays, F.col("__file"), F.col("__line"),
                     F.col("value").alias("__raw"), corrupt.alias("__corrupt"))


def _root_fields(spec: IngestSpec, fields: list[str]) -> list[str]:
    """The root-level JSON keys (or CSV columns) to parse: the fields read by name, plus
    the keys of single-step ``root``/``tree`` flatten fields."""
    flat = spec.input_format.flatten
    out = []
    for f in fields:
        found = flat.get(f)
        if found is None:
            out.append(f)
        elif len(found.steps) == 1 and isinstance(found.steps[0], str):
            out.append(found.steps[0])
    return list(dict.fromkeys(out))


def _parquet(spark: SparkSession, files: list[str], fields: list[str]) -> DataFrame:
    df = (_remote_parquet(spark, files, fields) if any(remote.is_remote(f) for f in files)
          else spark.read.parquet(*files))
    present = set(df.columns)
    cols: list[Column] = [F.col(f"`{f}`") if f in present else F.lit(None).cast("string").alias(f)
                          for f in fields]
    # No per-row file/row-index metadata columns here (materialising them for every row costs
    # as much as the scan); prepare() names the file with input_file_name(), evaluated only
    # for the rare bad row.
    return df.select(*cols, F.lit(None).cast("bigint").alias("__line"),
                     F.lit(None).cast("string").alias("__raw"), F.lit(False).alias("__corrupt"))


def _spark_type(t: Any) -> T.DataType:
    """The Spark type a remote Parquet column is handed over as (anything else: string)."""
    import pyarrow as pa

    if pa.types.is_integer(t):
        return T.LongType()
    if pa.types.is_floating(t):
        return T.DoubleType()
    if pa.types.is_boolean(t):
        return T.BooleanType()
    if pa.types.is_timestamp(t):
        return T.TimestampType()
    if pa.types.is_date(t):
        return T.DateType()
    return T.StringType()


def _remote_parquet(spark: SparkSession, files: list[str], fields: list[str]) -> DataFrame:
    """Parquet objects read by the executors with pyarrow (one task per object), typed as
    the first object's footer says. Only the JVM path uses it (the native reader reads
    object stores itself); Spark's own reader would need hadoop-aws, which pyspark does not
    ship."""
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(remote.open_random(files[0])).schema_arrow
    wanted = [f for f in schema if f.name in set(fields)]
    struct = T.StructType([T.StructField(f.name, _spark_type(f.type)) for f in wanted])
    names = [f.name for f in wanted]
    strings = {f.name for f, s in zip(wanted, struct.fields) if isinstance(s.dataType, T.StringType)}

    def rows(uri: str) -> Iterable[tuple[Any, ...]]:
        pf = pq.ParquetFile(remote.open_random(uri))
        present = [n for n in names if n in pf.schema_arrow.names]
        for rg in range(pf.metadata.num_row_groups):
            table = pf.read_row_group(rg, columns=present)
            cols = []
            for n in names:
                if n not in present:
                    cols.append([None] * table.num_rows)
                    continue
                col = table.column(n)
                cols.append((col.cast("string") if n in strings and col.type != "string"
                             else col).to_pylist())
            yield from zip(*cols)

    return spark.createDataFrame(
        spark.sparkContext.parallelize(files, len(files)).flatMap(rows), struct)


def resolve_lines(bad: Iterable[dict[str, object]]) -> None:
    """Fill in ``line`` of bad records read from text files by finding their raw text.

    Only the few saved parse exceptions go through here, one scan per file involved.
    """
    by_file: dict[str, list[dict[str, object]]] = {}
    for rec in bad:
        # Only text input has raw lines to look for (Parquet rows carry no raw text).
        if not rec.get("line") and rec.get("raw") and rec.get("file") not in (None, "", "inline"):
            by_file.setdefault(str(rec["file"]), []).append(rec)
    for uri, recs in by_file.items():
        path = uri[len("file:"):] if uri.startswith("file:") else uri
        path = path[2:] if path.startswith("//") else path
        wanted: dict[str, list[dict[str, object]]] = {}
        for rec in recs:
            wanted.setdefault(str(rec.get("raw", "")), []).append(rec)
        if remote.is_remote(uri):
            continue  # object-store lines were numbered as they were read
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    waiting = wanted.get(line.rstrip("\r\n"))
                    if waiting:
                        waiting.pop(0)["line"] = n
        except OSError:
            continue
