"""One task's JSON or CSV blocks read natively: pieces of lines -> parsed runs -> phase-1 rows.

The task side of the native text reader (the driver's plan is :mod:`shuffled.spark.phase1.native.text.plan`): each
piece of whole lines (:mod:`shuffled.spark.phase1.native.text.blocks`) is parsed (:mod:`shuffled.spark.phase1.native.text.json_lines`, :mod:`shuffled.spark.phase1.native.text.csv_lines`) and
its rows prepared (:mod:`shuffled.spark.phase1.native.text.prepare`), malformed lines becoming unparseable rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from shuffled.spark.phase1.native.text.csv_lines import parse_csv
from shuffled.spark.phase1.native.text.blocks import ByteMeter, pieces
from shuffled.spark.phase1.native.text.json_lines import JsonParser
from shuffled.spark.phase1.native.text.schema import schema_tree
from shuffled.spark.phase1.native.text.prepare import TextInput, malformed, output_schema, prepare_text


def block_ranges(blocks: tuple[int, ...]) -> list[tuple[int, int]]:
    """Consecutive block numbers as ``[first, end)`` ranges (a task reads them in order)."""
    out: list[tuple[int, int]] = []
    for b in blocks:
        if out and out[-1][1] == b:
            out[-1] = (out[-1][0], b + 1)
        else:
            out.append((b, b + 1))
    return out


_PARSERS: dict[int, tuple[TextInput, JsonParser]] = {}


def _parser(native: Any) -> JsonParser:
    """The task's JSON parser: one for all its splits, so the field types it learned in one
    (a number where text was guessed) serve the next."""
    text: TextInput = native.text
    known = _PARSERS.get(id(text))
    if known is not None and known[0] is text:
        return known[1]
    multi = {name for name, _ in text.multi}
    texts = {*(d for d, _ in native.dims), native.ts_column, *text.transform.reads}
    numbers = {f for _, kind, f in native.metrics if kind != "string"} - texts
    # Text is used of string dimensions and transform inputs, and of timestamps but millis
    # and scaled numbers ('12' is a year to ISO, 12.0 is not).
    strings = {d for d, kind in native.dims if kind == "string"} | set(text.transform.reads)
    if native.ts_format in ("auto", "iso"):
        strings.add(native.ts_column)
    strings |= {f for _, kind, f in native.metrics if kind == "string"}
    parser = JsonParser(schema_tree({k: v for k, v in text.sources if v is not None}, multi,
                                    {k for k, v in text.sources if v == (k,) and k in numbers},
                                    strings))
    _PARSERS.clear()  # one task at a time per Python worker
    _PARSERS[id(text)] = (text, parser)
    return parser


def read_text(path: str, blocks: tuple[int, ...], native: Any,
              meter: ByteMeter | None = None) -> Iterator[pa.Table]:
    """The phase-1 rows of ``blocks`` of ``path`` (one table or more per piece), the bytes
    read counted in ``meter``."""
    text: TextInput = native.text
    schema = output_schema(native)
    parser = _parser(native) if text.format == "json" else None
    skip = dict(text.skip).get(path, 0)
    for piece in pieces(path, text.block, block_ranges(blocks), skip, meter):
        if parser is not None:
            runs, bad = parser.parse(piece)
            parts = [(prepare_text(r.table, r.lines, piece, native).cast(schema), r.lines)
                     for r in runs]
        else:
            table, rows, bad = parse_csv(piece, text.columns, text.delimiter, text.headers)
            parts = [(prepare_text(table, rows, piece, native).cast(schema), rows)]
        if not bad:
            yield from (t for t, _ in parts)
            continue
        # Malformed lines among the rows, in line order: the first few unparseable rows a
        # task keeps are then the first in the file, as with the JVM reader.
        parts.append((malformed(bad, piece, schema, text.format), np.array(bad, dtype=np.int64)))
        table = pa.concat_tables([t for t, _ in parts])
        yield table.take(pa.array(np.argsort(np.concatenate([r for _, r in parts]), kind="stable")))
