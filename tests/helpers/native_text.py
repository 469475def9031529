"""Native text reader vs the JVM reader on phase 1's prepared rows (no daemons needed).

:func:`prepared_both` gives, for one spec, the rows the JVM path hands to phase 1
(:func:`shuffled.spark.phase1.jvm.prepare.prepare` over :func:`.source.load_input`, collected
from Spark) and the rows the native reader prepares (every planned split read in this
process, small blocks so lines cross block ends), both as sorted lists of tuples: the
columns phase 1 rolls up and ``__bad`` (the JVM path learns local files' line numbers on
the driver, so they are compared separately, against the file).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from shuffled.spark.phase1.native.reader import SplitSizing, plan_native, read_split
from shuffled.spark.rows.rollup import BAD
from shuffled.spark.spec.model import PartitionPlan


def text_spec(base: Path, fmt: str, *, filter_: str | None = None, **data_schema: Any) -> dict[str, Any]:
    """A JSON or CSV spec over ``base`` with the dataSchema parts given (hashed, 1 shard)."""
    schema = {"dataSource": "t", "timestampSpec": {"column": "ts", "format": "auto"},
              "dimensionsSpec": {"dimensions": ["d"]},
              "metricsSpec": [{"type": "count", "name": "count"}],
              "granularitySpec": {"segmentGranularity": "day", "queryGranularity": "hour"}}
    schema.update(copy.deepcopy(data_schema))
    fmt_spec: dict[str, Any] = {"type": fmt} if isinstance(fmt, str) else fmt
    return {"type": "index_parallel", "spec": {
        "dataSchema": schema,
        "ioConfig": {"type": "index_parallel",
                     "inputSource": {"type": "local", "baseDir": str(base),
                                     "filter": filter_ or f"*.{fmt_spec['type']}"},
                     "inputFormat": fmt_spec},
        "tuningConfig": {"type": "index_parallel", "forceGuaranteedRollup": True,
                         "partitionsSpec": {"type": "hashed", "numShards": 1}}}}


def _normal(table: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    cols = []
    for c in columns:
        a = table.column(c).combine_chunks()
        if pa.types.is_dictionary(a.type):
            a = a.cast(a.type.value_type)
        values = a.to_pylist()
        if c == BAD:  # the line number: compared on its own (see module doc)
            values = [v if v is None or v == "T" else "\t".join(v.split("\t")[:2] + v.split("\t")[3:])
                      for v in values]
        cols.append(values)
    # A flagged row is dropped by the task: only its flag (reason, file, text) matters; a row
    # with a column's parse error ("E", processedWithError) is kept: all of it matters.
    rows = [r if r[-1] is None or r[-1].startswith("E") else (r[-1],) for r in zip(*cols)]
    rows = [tuple("NaN" if isinstance(v, float) and v != v else v for v in r) for r in rows]
    return sorted(rows, key=repr)


def prepared_both(spark: Any, spec: dict[str, Any], block: int = 1 << 16,
                  ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], pa.Table]:
    """(JVM rows, native rows, the native table) of ``spec`` (see module doc)."""
    from shuffled.spark.driver.sparksession import job_conf
    from shuffled.spark.phase1.columns import native_multi_value
    from shuffled.spark.phase1.jvm.prepare import multi_value_dimensions, prepare
    from shuffled.spark.phase1.source import load_input, resolve_files
    from shuffled.spark.spec.parse import parse_spec

    s = parse_spec(spec)
    files = resolve_files(s)
    plan = PartitionPlan("hashed", (), num_shards=1)
    planned = plan_native(s, plan, files, SplitSizing(max_bytes=block, open_cost=0, parallelism=2))
    assert not isinstance(planned, str), planned
    native, tasks = planned
    tables = [t for task in tasks for split in task for t in read_split(split, native, [])]
    mine = pa.concat_tables(tables) if tables else None
    with job_conf(spark):
        rows = load_input(spark, s, files)
        # The late plan takes its multi-value dimensions from the spec, never building
        # these rows: it must name the ones the JVM reader's rows would.
        assert native_multi_value(s) == multi_value_dimensions(rows, s)
        jvm = prepare(rows, s).toArrow()
    columns = [c for c in jvm.column_names if c != BAD] + [BAD]
    assert mine is not None and set(columns) == set(mine.column_names), (columns, mine and mine.column_names)
    return _normal(jvm, columns), _normal(mine, columns), mine


def bad_lines(table: pa.Table) -> list[tuple[str, int, str, str]]:
    """(file, line, reason, raw) of each unparseable or processed-with-error row of a native
    prepared table."""
    out = []
    for v in table.column(BAD).to_pylist():
        if v and v != "T":
            _, file, line, reason, raw = v.split("\t", 4)
            out.append((file, int(line), reason, raw))
    return sorted(out)


def check_lines(bad: list[tuple[str, int, str, str]]) -> None:
    """Each reported line number is the line whose text is reported (the file read here)."""
    for file, line, _, raw in bad:
        path = file[len("file:"):]
        with open(path, encoding="utf-8", errors="replace", newline="") as fh:
            text = fh.read().split("\n")[line - 1]
        assert text.rstrip("\r") == raw, (file, line, raw, text)


def write_lines(path: Path, lines: list[str | dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
