"""The driver's plan of a native JSON or CSV read: blocks of each file packed into tasks.

Only file sizes are needed (a task finds its lines itself, :mod:`shuffled.spark.phase1.native.text.blocks`), so planning
reads nothing but CSV's header lines. The plan is refused, with the reason the task report
gives as ``readerReason``, for what the native text reader does not compute: inline data,
transforms :func:`shuffled.spark.phase1.arrow_expr.transform.unsupported` names, flatten paths of other shapes.
"""

from __future__ import annotations

import difflib
import itertools
import math
from typing import Any

from shuffled.spark.fs import compressed, remote
from shuffled.spark.phase1.arrow_expr.transform import unsupported
from shuffled.spark.phase1.columns import metric_column, metric_time_column
from shuffled.spark.phase1.native.text.blocks import skipped_bytes
from shuffled.spark.phase1.native.text.prepare import Steps, TextInput
from shuffled.spark.spec.model import IngestSpec
from shuffled.spark.spec.parse import SpecError

#: Largest block: a task reads a block in pieces anyway; small blocks balance tasks.
MAX_BLOCK = 32 << 20
MIN_BLOCK = 64 << 10


def _sources(spec: IngestSpec) -> dict[str, Steps | None]:
    """Where each input field is in a record, as :func:`.source.load_input` reads it."""
    fmt = spec.input_format
    out: dict[str, Steps | None] = {}
    for f in spec.input_fields:
        found = fmt.flatten.get(f)
        if found is not None:
            out[f] = tuple(found.steps)
        elif fmt.flatten.discover or fmt.type != "json":
            out[f] = (f,)
        else:
            out[f] = None
    return out


def _flatten_problem(sources: dict[str, Steps | None]) -> str | None:
    paths = {k: v for k, v in sources.items() if v is not None}
    for name, steps in paths.items():
        if isinstance(steps[0], int):
            return f"flatten field {name} starts with an array index"
        for other, more in paths.items():
            if other == name:
                continue
            if len(more) > len(steps) and more[: len(steps)] == steps:
                return f"field {name} is read whole and by the path of {other}"
            for i, (a, b) in enumerate(zip(steps, more)):
                if steps[:i] != more[:i]:
                    break
                if isinstance(a, int) != isinstance(b, int):
                    return f"fields {name} and {other} read one value as an object and an array"
    return None


def text_input(spec: IngestSpec, files: list[str], sizing: Any,
               ) -> tuple[TextInput, list[tuple[str, tuple[int, ...], int]]] | str:
    """The text part of the native input and its splits, (path, block numbers, bytes) each
    (an HTTP file is one split: fetched once), or why the JVM reader is needed."""
    fmt = spec.input_format
    kind = fmt.type
    if spec.input_source.type == "inline" or not files:
        return "inline data (the native reader reads files)"
    if spec.transform:
        problem = unsupported(spec.transform)
        if problem:
            return problem
    sources = _sources(spec)
    problem = _flatten_problem(sources)
    if problem:
        return problem
    sized = []
    for path in files:
        try:
            sized.append((path, remote.size(path)))
        except OSError as exc:
            return f"cannot find the size of {path}: {exc}"
    # As Spark sizes file splits: each file also costs openCostInBytes, so small files
    # are not all packed into one task.
    total = sum(s + sizing.open_cost for _, s in sized)
    target = min(sizing.max_bytes, max(sizing.open_cost, math.ceil(total / max(sizing.parallelism, 1))))
    block = max(MIN_BLOCK, min(MAX_BLOCK, target))
    columns: tuple[str, ...] = ()
    headers: frozenset[str] = frozenset()
    skip: tuple[tuple[str, int], ...] = ()
    if kind == "csv":
        cols, found = csv_columns(spec, files)
        columns, headers = tuple(cols), frozenset(found)
        if fmt.skip_header_rows:  # Druid skips them in each file, then reads the header
            skip = tuple((p, skipped_bytes(p, fmt.skip_header_rows)) for p in files)
    from shuffled.spark.phase1.columns import json_fields

    multi_names = json_fields(spec)
    single = spec.partitions.dimensions if spec.partitions.type in ("range", "single_dim") else ()
    text = TextInput(
        format=kind, block=block, sources=tuple(sources.items()),
        multi=tuple((d.name, d.multi_value_handling) for d in spec.dimensions
                    if d.name in multi_names),
        single=tuple(single),
        metric_names=tuple((metric_column(i), m.name) for i, m in enumerate(spec.metrics) if m.field),
        first_last=tuple((metric_column(i), metric_time_column(i), m.time_column,
                          m.max_string_bytes if m.value_type == "string" else None)
                         for i, m in enumerate(spec.metrics) if m.first_last),
        transform=spec.transform, columns=columns, delimiter=fmt.delimiter, headers=headers,
        skip=skip, reason=f"newline-delimited {kind.upper()} input the native reader covers")
    splits: list[tuple[str, tuple[int, ...], int]] = []
    for path, size in sized:
        count = math.ceil(size / block)
        if compressed.codec(path):  # read from its start only: one split (as Druid's)
            splits.append((path, (0,), size + sizing.open_cost))
        elif remote.scheme(path) in ("http", "https"):
            splits.append((path, tuple(range(count)), size + sizing.open_cost))
        else:
            splits += [(path, (k,), min(block, size - k * block) + (sizing.open_cost if k == 0 else 0))
                       for k in range(count)]
    if not splits:
        return "the input files are empty"
    return text, splits


def csv_columns(spec: IngestSpec, files: list[str]) -> tuple[list[str], set[str]]:
    """CSV column names and the header lines to skip: each file's line after its first
    ``skipHeaderRows`` (Druid skips those, then reads the header)."""
    fmt = spec.input_format
    headers: set[str] = set()
    if fmt.find_columns_from_header:
        firsts = _first_lines(spec, files)
        if not firsts:
            raise SpecError("$.spec.ioConfig.inputFormat", "no header row found" + (
                f" after skipHeaderRows ({fmt.skip_header_rows})" if fmt.skip_header_rows else ""))
        headers = set(firsts)
        columns = [c.strip().strip('"') for c in firsts[0].split(fmt.delimiter)]
        missing = [c for c in spec.input_fields if c not in columns]
        if missing:
            where = files[0] if files else "inline data"
            close = difflib.get_close_matches(missing[0], columns, n=1, cutoff=0.6)
            raise SpecError(_reader_of(spec, missing[0]),
                            f"names column {missing[0]!r}, which the header of {where} lacks"
                            + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; the header has {columns[:20]}")
        return columns, headers
    return list(fmt.columns), headers


def _reader_of(spec: IngestSpec, column: str) -> str:
    """The JSON path of the spec field that reads input column ``column`` (a misspelt name
    is the field's mistake, not the header's)."""
    schema = "$.spec.dataSchema"
    if column == spec.timestamp.column:
        return f"{schema}.timestampSpec.column"
    for i, name in enumerate(spec.dimension_names):
        if name == column:
            return f"{schema}.dimensionsSpec.dimensions[{i}]"
    for i, metric in enumerate(spec.metrics):
        if column in (metric.field, metric.time_column):
            return f"{schema}.metricsSpec[{i}]"
    return "$.spec.dataSchema.transformSpec"


def _first_lines(spec: IngestSpec, files: list[str]) -> list[str]:
    """Each file's header line: its line after the first ``skipHeaderRows``."""
    skip = spec.input_format.skip_header_rows
    if spec.input_source.type == "inline":
        lines = (spec.input_source.data or "").splitlines()
        return lines[skip:skip + 1]
    out = []
    for path in files:
        line = next(itertools.islice(remote.read_lines(path), skip, None), "")
        if line:
            out.append(line)
    return out
