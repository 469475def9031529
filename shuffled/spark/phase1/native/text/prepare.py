"""Phase-1 rows of natively read JSON and CSV: what :func:`shuffled.spark.phase1.jvm.prepare.prepare` computes, on Arrow.

``__chunk, __time, <dimensions>, __m<i>..., [__mt<i>...], __bad`` for one run of rows
(:mod:`shuffled.spark.phase1.native.text.json_lines`, :mod:`shuffled.spark.phase1.native.text.csv_lines`), checked row for row against the JVM reader: the
timestamp (:mod:`shuffled.spark.phase1.native.text.values`), the transforms and filter (:mod:`shuffled.spark.phase1.arrow_expr.transform`), typed
dimensions and metrics, multi-value dimensions, and ``__bad`` with the JVM's first reason in
the JVM's order (malformed record, timestamp, ``__time`` transform, dimensions, metrics) and
the file, line and text of the line. Messages are built only for the rows they concern.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.phase1.arrow_expr.transform import apply_transforms
from shuffled.spark.phase1.arrow_expr.values import STRING, AVal, cast_value
from shuffled.spark.phase1.native.text.blocks import Piece
from shuffled.spark.phase1.native.text.values import plain, shown, text_of, timestamp_millis, typed
from shuffled.spark.rows.multivalue import ITEM, SEP
from shuffled.spark.rows.rollup import BAD, CHUNK, TIME, WITH_ERROR
from shuffled.spark.spec.granularity import truncate_array
from shuffled.spark.spec.transform import TransformSpec

Steps = tuple[str | int, ...]
Problem = tuple[np.ndarray, Callable[[int], str]]


@dataclass(frozen=True)
class TextInput:
    """How a task reads JSON or CSV lines (the text part of :class:`shuffled.spark.phase1.native.reader.NativeInput`)."""

    format: str  # json | csv
    block: int  # bytes per block: a text Split's row_groups are block numbers
    sources: tuple[tuple[str, Steps | None], ...]  # input field -> its path (None: null)
    multi: tuple[tuple[str, str], ...] = ()  # JSON dimensions that may be arrays, handling
    single: tuple[str, ...] = ()  # range partition dimensions: one value each
    metric_names: tuple[tuple[str, str], ...] = ()  # __m<i> -> the metric's name (messages)
    # first/last metrics: (value column, time column, time field, characters kept or None)
    first_last: tuple[tuple[str, str, str, int | None], ...] = ()
    transform: TransformSpec = field(default_factory=TransformSpec)
    columns: tuple[str, ...] = ()  # CSV
    delimiter: str = ","
    headers: frozenset[str] = frozenset()
    skip: tuple[tuple[str, int], ...] = ()  # CSV: bytes of each file's skipHeaderRows lines
    reason: str = ""


def value_at(table: pa.Table, steps: Steps | None) -> pa.Array:
    """The value at ``steps`` in each row (null where the path does not lead anywhere)."""
    n = table.num_rows
    if steps is None or steps[0] not in table.column_names:
        return pa.nulls(n, pa.null())
    a = plain(table.column(str(steps[0])))
    for step in steps[1:]:
        if isinstance(step, int):
            if not pa.types.is_list(a.type):
                return pa.nulls(n, pa.null())
            lengths = pc.fill_null(pc.list_value_length(a), 0).to_numpy(zero_copy_only=False)
            ok = lengths > step
            at = np.where(ok, a.offsets.to_numpy()[:-1] + step, 0)
            a = a.values.take(pa.array(at)) if len(a.values) else pa.nulls(n, a.type.value_type)
            a = pc.if_else(pa.array(ok), a, pa.scalar(None, a.type))
        else:
            if not pa.types.is_struct(a.type) or a.type.get_field_index(step) < 0:
                return pa.nulls(n, pa.null())
            child = pc.struct_field(a, [a.type.get_field_index(step)])
            a = pc.if_else(pc.is_valid(a), child, pa.scalar(None, child.type))
    return a


def prepare_text(table: pa.Table, lines: np.ndarray, piece: Piece, native: Any) -> pa.Table:
    """The phase-1 columns of ``table`` (rows read from ``lines`` of ``piece``)."""
    text: TextInput = native.text
    n = table.num_rows
    fields = {name: value_at(table, steps) for name, steps in text.sources}
    steps = dict(text.sources)

    def show(a: pa.Array, i: int, name: str) -> str:
        """A value as the JVM's message shows it: its JSON text (a float64 column may hold
        an integer too big for int64: the line has its digits)."""
        path = steps.get(name)
        if pa.types.is_floating(a.type) and text.format == "json" and path:
            return _json_text(piece.lines.text(int(lines[i])), path)
        return shown(a, i)

    def not_a(message: str, a: pa.Array, name: str) -> Callable[[int], str]:
        """The message of a bad row ``i``: ``message`` and the value of ``name`` there."""
        return lambda i: f"{message} [{show(a, i, name)}]"

    def resolver(name: str) -> Any:
        path = steps.get(name)
        if text.format != "json" or not path:
            return None
        return lambda idx: [_json_text(piece.lines.text(int(lines[i])), path) for i in idx]

    raw_ts = fields[native.ts_column]
    millis = timestamp_millis(raw_ts, native.ts_format, native.ts_column)
    if native.missing_value is not None:
        millis = pc.if_else(pc.is_null(raw_ts), pa.scalar(native.missing_value, pa.int64()), millis)
    problems: list[Problem] = [(~_valid(millis), lambda i: f"unparseable timestamp [{show(raw_ts, i, native.ts_column)}]")]
    time, keep = millis, np.ones(n, dtype=bool)
    outputs: dict[str, AVal] = {}
    if text.transform:
        inputs = {k: text_of(fields[k], k, resolver(k)) for k in text.transform.reads if k in fields}
        outputs, keep, time = apply_transforms(text.transform, inputs, millis)
        problems.append((~_valid(time), lambda i: "the __time transform gave null"))
    cols: dict[str, pa.Array] = {}
    errors: list[Problem] = []  # a column's parse error: the row is kept, the value null
    multi = dict(text.multi)
    for name, kind in native.dims:
        if name in multi and name not in outputs:
            cols[name], why = _multi_value(fields[name], multi[name], name in text.single, name,
                                           resolver(name))
            problems.append(why)
            continue
        value, bad, src = _typed_input(fields, outputs, name, kind, resolver(name))
        cols[name] = pc.dictionary_encode(value) if kind == "string" else value
        errors.append((bad, not_a(f"dimension [{name}]: not a {kind}", src, name)))
    names = dict(text.metric_names)
    for column, kind, source in native.metrics:
        name = names.get(column, source)
        value, bad, src = _typed_input(fields, outputs, source, kind, resolver(source))
        cols[column] = value
        errors.append((bad, not_a(f"field [{source}] of metric [{name}]: not a number", src,
                                  source)))
    for column, time_column, time_field, chars in text.first_last:
        if chars is not None:  # Druid's loose chop of a string value: characters
            cols[column] = pc.utf8_slice_codeunits(cols[column], 0, chars)
        cols[time_column] = time if time_field == "__time" else timestamp_millis(
            fields.get(time_field, pa.nulls(n, pa.null())) if time_field not in outputs
            else outputs[time_field].arr, "millis", time_field)
    ms = plain(time).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    chunk = truncate_array(ms, native.segment_granularity)
    if native.intervals:
        inside = np.zeros(n, dtype=bool)
        for first, end in native.intervals:
            inside |= (chunk >= first) & (chunk < end)
        keep = keep & inside
    out = {CHUNK: pa.array(chunk), TIME: pa.array(truncate_array(ms, native.query_granularity))}
    out.update(cols)
    out[BAD] = bad_column(problems, keep, lines, piece, n, errors)
    return pa.table(out)


def _json_text(line: str, steps: Steps) -> str:
    """The text Spark gives the value at ``steps`` of one JSON line (for a message)."""
    import json

    from shuffled.spark.phase1.spark_compat.java_text import java_double

    value: Any = json.loads(line, parse_int=str, parse_float=lambda t: java_double(float(t)))
    for step in steps:
        ok = isinstance(value, list) if isinstance(step, int) else isinstance(value, dict)
        value = value[step] if ok and (not isinstance(step, int) or step < len(value)) and (
            isinstance(step, int) or step in value) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _valid(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.is_valid(a).to_numpy(zero_copy_only=False)


def _typed_input(fields: dict[str, pa.Array], outputs: dict[str, AVal], name: str,
                 kind: str, resolve: Any = None) -> tuple[pa.Array, np.ndarray, pa.Array]:
    """A dimension's or metric's value as ``kind``: a transform's output is cast (no bad
    rows, as Spark's try_cast of a typed column), an input field typed as text is."""
    if name in outputs and outputs[name].type != STRING:
        value = cast_value(outputs[name], kind)
        return value, np.zeros(len(value), dtype=bool), outputs[name].arr
    src = outputs[name].arr if name in outputs else fields.get(name)
    if src is None:
        src = pa.nulls(len(next(iter(fields.values()))), pa.null())
    value, bad = typed(src, kind, name, resolve)
    return value, bad, src


def _multi_value(a: pa.Array, handling: str, single: bool, name: str,
                 resolve: Any = None) -> tuple[pa.Array, Problem]:
    """A JSON string dimension that may hold arrays, in rows.multivalue's one-string form."""
    a = plain(a)
    if not pa.types.is_list(a.type):
        value = pc.dictionary_encode(text_of(a, name, resolve))
        nul = np.zeros(n := len(a), dtype=bool)
        in_dict = pc.match_substring(value.dictionary, SEP)  # each distinct value once
        if pc.any(in_dict).as_py():
            nul = pc.fill_null(pc.take(in_dict, value.indices), False).to_numpy(zero_copy_only=False)
        del n
        return value, (nul, lambda i: f"dimension [{name}]: a value contains U+0000")
    n = len(a)
    items = text_of(a.flatten(), name)
    parents = pc.list_parent_indices(a).to_numpy(zero_copy_only=False)
    if handling != "ARRAY" and len(items):
        order = pa.table({"p": parents, "v": items}).sort_by(
            [("p", "ascending", "at_start"), ("v", "ascending", "at_start")])
        parents, items = order.column("p").to_numpy(), order.column("v").combine_chunks()
        if handling == "SORTED_SET":
            same = np.zeros(len(items), dtype=bool)
            if len(items) > 1:
                eq = pc.fill_null(pc.equal(items[1:], items[:-1]), False).to_numpy(zero_copy_only=False)
                both_null = ~_valid(items[1:]) & ~_valid(items[:-1])
                same[1:] = (parents[1:] == parents[:-1]) & (eq | both_null)
            parents, items = parents[~same], items.filter(pa.array(~same))
    sizes = np.bincount(parents, minlength=n) if len(parents) else np.zeros(n, dtype=np.int64)
    nul_item = pc.fill_null(pc.match_substring(items, SEP), False).to_numpy(zero_copy_only=False)
    nul = np.bincount(parents[nul_item], minlength=n) > 0 if nul_item.any() else np.zeros(n, bool)
    marked = pc.fill_null(pc.binary_join_element_wise(ITEM, items, ""), "")
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), marked), SEP)
    firsts = items.take(pa.array(np.minimum(offsets[:-1], max(len(items) - 1, 0)))) if len(items) else pa.nulls(n, pa.string())
    value = pc.if_else(pa.array(sizes >= 2), joined, pc.if_else(pa.array(sizes == 1), firsts,
                                                              pa.scalar(None, pa.string())))
    value = pc.if_else(pc.is_valid(a), value, pa.scalar(None, pa.string()))
    many = single & (sizes > 1) & _valid(a)

    def why(i: int) -> str:
        return (f"dimension [{name}]: a value contains U+0000" if nul[i]
                else f"dimension [{name}]: multi-value in a range partition dimension")

    return pc.dictionary_encode(value), (nul | many, why)


def bad_column(problems: list[Problem], keep: np.ndarray, lines: np.ndarray, piece: Piece,
               n: int, errors: list[Problem] | None = None) -> pa.Array:
    """``__bad``: null, ``'T'`` (thrown away), the first problem's location and reason
    (``U``: unparseable), or for a kept row with column errors every error (``E``: Druid's
    processedWithError), as :func:`shuffled.spark.phase1.jvm.prepare.prepare` gives it."""
    flagged = np.zeros(n, dtype=bool)
    for mask, _ in problems:
        flagged |= mask
    errors = errors or []
    erred = np.zeros(n, dtype=bool)
    for mask, _ in errors:
        erred |= mask
    erred &= keep & ~flagged
    if not flagged.any() and keep.all() and not erred.any():
        return pa.nulls(n, pa.string())
    out = pc.if_else(pa.array(~keep), pa.scalar("T"), pa.scalar(None, pa.string()))
    if not flagged.any() and not erred.any():
        return out
    first = piece.first_line()
    texts = []
    marked = flagged | erred
    for i in np.flatnonzero(marked).tolist():  # only the rows with problems: few
        if flagged[i]:
            flag, reason = "U", next(text for mask, text in problems if mask[i])(i)
        else:
            flag, reason = WITH_ERROR, "; ".join(text(i) for mask, text in errors if mask[i])
        line = int(lines[i])
        texts.append(f"{flag}\t{piece.uri}\t{first + line}\t{reason}\t{piece.lines.text(line)[:1000]}")
    return pc.replace_with_mask(out, pa.array(marked), pa.array(texts, pa.string()))


def output_schema(native: Any) -> pa.Schema:
    """The columns :func:`prepare_text` gives (string dimensions dictionary-encoded)."""
    types = {"long": pa.int64(), "double": pa.float64(), "float": pa.float32(),
             "string": pa.string()}
    fields = [pa.field(CHUNK, pa.int64()), pa.field(TIME, pa.int64())]
    fields += [pa.field(d, pa.dictionary(pa.int32(), pa.string()) if k == "string" else types[k])
               for d, k in native.dims]
    fields += [pa.field(c, types[k]) for c, k, _ in native.metrics]
    fields += [pa.field(t, pa.int64()) for _, t, _, _ in native.text.first_last]
    return pa.schema(fields + [pa.field(BAD, pa.string())])


def malformed(bad: list[int], piece: Piece, schema: pa.Schema, fmt: str) -> pa.Table:
    """Rows for malformed lines: nulls, and ``__bad`` saying where (schema: a run's)."""
    n = len(bad)
    cols = [pa.nulls(n, f.type) if not pa.types.is_dictionary(f.type) else
            pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], pa.string()))
            for f in schema if f.name != BAD]
    flags = bad_column([(np.ones(n, dtype=bool), lambda i: f"malformed {fmt} record")],
                       np.ones(n, dtype=bool), np.array(bad, dtype=np.int64), piece, n)
    return pa.Table.from_arrays([*cols, flags], schema=schema)
