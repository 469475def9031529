"""Newline-delimited JSON parsed by pyarrow.json the way Spark's ``from_json`` reads it.

Only the fields the spec reads are parsed (an explicit schema; other keys are ignored). A
field's Arrow type follows its JSON values: text, integers, decimals, booleans, an object
along a flatten path, an array (a multi-value dimension or an index step). pyarrow reads
one type per field, so where a value's kind changes (``"clicks": 5`` then
``"clicks": "many"``) the piece is read in runs of rows, each with its types; every run
goes on to :mod:`shuffled.spark.phase1.native.text.prepare`, which computes what the JVM computes from each kind.

A line pyarrow cannot parse is isolated (pyarrow names the row it stopped at) and reported
as ``malformed json record``, as Spark's PERMISSIVE mode does, unless Spark's more lenient
parser would have read it (single quotes, trailing text after the object, repeated keys,
bad UTF-8): then :class:`.Declined`. So are whitespace-only lines with tabs (Spark: a
malformed record; pyarrow: nothing), lines holding two objects, and ``NaN``/``Infinity``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from shuffled.spark.phase1.native.text.blocks import Declined, Piece
from shuffled.spark.phase1.native.text.schema import LEAF, Node, find, leaves

_KIND = re.compile(r"Column\((?P<path>[^)]*)\) changed from (?P<old>\w+) to (?P<new>\w+) in row (?P<row>\d+)")
_NULL_FIRST = re.compile(rb"[ \t\r\n]*null(?:[ \t\r\n]|$)")
_ROW = re.compile(r"in row (?P<row>\d+)")
_NUMBER = re.compile(r"couldn't parse:\s*(?P<text>\S*)")
_SPACE = np.zeros(256, dtype=bool)  # JSON whitespace
_SPACE[[9, 10, 13, 32]] = True


@dataclass
class Run:
    """Rows parsed with one set of types: ``table`` and each row's line in the piece."""

    table: pa.Table
    lines: np.ndarray


class JsonParser:
    """Parses pieces of one task's JSON lines, keeping the types it learned across them."""

    def __init__(self, root: Node) -> None:
        self.root = root

    def schema(self) -> pa.Schema:
        return pa.schema([(k, v.arrow()) for k, v in (self.root.keys or {}).items()])

    def _read(self, data: bytes, schema: pa.Schema | None = None) -> pa.Table:
        # A serial read costs ~2 ms before any byte (0.75 ms threaded): threads for small
        # reads only (a task reads its big pieces on its own core).
        return pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(
            use_threads=len(data) < (1 << 20), block_size=max(len(data), 1) + 1),
            parse_options=pj.ParseOptions(explicit_schema=self.schema() if schema is None else schema,
                                          unexpected_field_behavior="ignore"))

    def parse(self, piece: Piece) -> tuple[list[Run], list[int]]:
        """The runs of rows of ``piece`` and its malformed lines (indexes in the piece)."""
        runs: list[Run] = []
        bad: list[int] = []
        count = piece.count
        for _ in range(8):  # the usual case: one read, no line index at all
            if _NULL_FIRST.match(piece.data):
                break
            try:
                table = self._read(piece.data)
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                # A type guessed wrong from the first row on (a number where text was
                # expected): change it and read again; anything else is looked at closely.
                kind = _KIND.search(str(exc))
                if not (kind and kind.group("row") == "0" and kind.group("path")
                        and self._retype(kind.group("path"), kind.group("new"), piece, 0, False)):
                    break
                continue
            if table.num_rows == count and not piece.empty_lines:
                rows = np.arange(count, dtype=np.int64)
                table, rows = self._nulls(table, piece, rows, bad)
                return [Run(table, rows)], bad
            break
        self._careful(piece, runs, bad)
        return runs, sorted(bad)

    def _careful(self, piece: Piece, runs: list[Run], bad: list[int]) -> None:
        """Line by line where it matters. pyarrow reads JSON across newlines, so a line
        that does not start with ``{`` and end with ``}`` could run on into the next; such
        a line is no JSON object anyway (Spark: malformed), so it is set aside and the
        other lines are read together, without it."""
        lines = piece.lines
        raw = np.frombuffer(piece.data, dtype=np.uint8)
        solid = np.flatnonzero(~_SPACE[raw])
        at_first = np.searchsorted(solid, lines.starts)
        at_last = np.searchsorted(solid, lines.ends) - 1
        has = lines.visible > 0
        first = raw[solid[np.minimum(at_first, len(solid) - 1)]] if len(solid) else np.zeros(0)
        last = raw[solid[np.maximum(at_last, 0)]] if len(solid) else np.zeros(0)
        plain = has & (first == ord("{")) & (last == ord("}"))
        # Blank lines: pyarrow skips them; Spark reads one with a tab (any character but
        # spaces) as a malformed record.
        bad.extend(np.flatnonzero(~has & ~lines.spaces_only).tolist())
        for i in np.flatnonzero(has & ~plain).tolist():
            self._malformed(piece, i, bad)
        keep = np.flatnonzero(plain)
        if len(keep) == lines.count:
            self._range(piece, 0, lines.count, runs, bad)
            return
        if not len(keep):
            return
        inner, inner_runs, inner_bad = piece.select(keep), [], []  # type: ignore[var-annotated]
        self._range(inner, 0, len(keep), inner_runs, inner_bad)
        runs.extend(Run(r.table, keep[r.lines]) for r in inner_runs)
        bad.extend(keep[inner_bad].tolist())

    def _range(self, piece: Piece, lo: int, hi: int, runs: list[Run], bad: list[int]) -> None:
        """Lines ``[lo, hi)``, each an object on its own line (or blank)."""
        lines = piece.lines
        while lo < hi:
            rows = lo + np.flatnonzero(lines.visible[lo:hi] > 0)
            if not len(rows):
                return
            end = int(lines.starts[hi]) if hi < lines.count else len(piece.data)
            data = piece.data[int(lines.starts[lo]):end]
            if len(rows) == 1:
                self._single(piece, int(rows[0]), runs, bad)
                return
            if self._is_null(piece, int(rows[0])):  # pyarrow crashes on a null first row
                self._malformed(piece, int(rows[0]), bad)
                lo = int(rows[0]) + 1
                continue
            try:
                table = self._read(data)
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                message = str(exc)
                found = _KIND.search(message) or _ROW.search(message)
                if _NUMBER.search(message) and not _KIND.search(message):
                    self._widen(data, _NUMBER.search(message).group("text"), piece)  # type: ignore[union-attr]
                    continue
                row = int(found.group("row")) if found else len(rows) // 2
                at = int(rows[min(max(row, 1 if not found else row), len(rows) - 1)])
                if at <= int(rows[0]):  # the first row is the problem: alone
                    self._single(piece, int(rows[0]), runs, bad)
                    lo = int(rows[0]) + 1
                else:  # the rows before it (perhaps it too: pyarrow may count it already)
                    self._range(piece, lo, at, runs, bad)
                    lo = at
                continue
            if table.num_rows != len(rows):
                raise Declined(f"{piece.uri}: a line near {piece.number(lo)} holds more "
                               "than one JSON value")
            table, rows = self._nulls(table, piece, rows, bad)
            runs.append(Run(table, rows))
            return

    def _single(self, piece: Piece, line: int, runs: list[Run], bad: list[int]) -> None:
        """One line alone: a row, adapting the types to it, or a malformed record."""
        lines = piece.lines
        data = piece.data[int(lines.starts[line]):int(lines.ends[line])]
        if not data.strip(b" \t\r\n"):
            return
        if self._is_null(piece, line):
            self._malformed(piece, line, bad)
            return
        for _ in range(64):  # each retry changes a type; a value has few kinds
            try:
                table = self._read(data)
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                kind, number = _KIND.search(str(exc)), _NUMBER.search(str(exc))
                if number and not kind:
                    self._widen(data, number.group("text"), piece)
                    continue
                if kind and kind.group("path") and self._valid(data):
                    self._retype(kind.group("path"), kind.group("new"), piece, line)
                    continue
                self._malformed(piece, line, bad)
                return
            if table.num_rows != 1:
                raise Declined(f"{piece.uri}:{piece.number(line)}: more than one JSON "
                               "value on a line")
            runs.append(Run(table, np.array([line], dtype=np.int64)))
            return
        raise Declined(f"{piece.uri}:{piece.number(line)}: JSON values of mixed kinds")

    def _valid(self, data: bytes) -> bool:
        """Whether ``data`` is one JSON object to pyarrow, whatever its fields hold."""
        try:
            return self._read(data, pa.schema([])).num_rows == 1
        except (pa.ArrowInvalid, UnicodeDecodeError):
            return False

    def _is_null(self, piece: Piece, line: int) -> bool:
        lines = piece.lines
        return piece.data[int(lines.starts[line]):int(lines.ends[line])].strip(b" \t\r\n") == b"null"

    def _retype(self, path: str, new: str, piece: Piece, line: int, strict: bool = True) -> bool:
        """Read the value at ``path`` as JSON kind ``new`` from row ``line`` on (False, if
        not ``strict``, where :class:`.Declined` would be raised)."""
        def where() -> str:  # counting lines costs: only for a message
            return f"{piece.uri}:{piece.number(line)}"

        if not strict:
            try:
                return self._retype(path, new, piece, line)
            except Declined:
                return False
        parent = find(self.root, path.rsplit("/", 1)[0]) if path.endswith("/[]") else None
        if parent is not None and parent.multi:  # a multi-value dimension's elements
            if new not in ("string", "number", "boolean"):
                raise Declined(f"{where()}: a JSON {new} inside the array of {path[1:-3]}")
            parent.leaf = pa.list_(LEAF[new])
            return True
        node = find(self.root, path)
        if node is None:
            raise Declined(f"{where()}: a JSON {new} at {path}")
        if node.leaf is not None:
            if new in LEAF:
                node.leaf = LEAF[new]
            elif new == "array" and node.multi:
                node.leaf = pa.list_(pa.string())
            else:
                raise Declined(f"{where()}: a JSON {new} in {path[1:]}, which is read as text")
            return True
        # An object (array) along a flatten path met as another kind: rows of that kind
        # read it as such, and the path through it gives null (as get_json_object does).
        shape = "object" if node.items is None else "array"
        node.scalar = None if new == shape else (
            LEAF.get(new) or (pa.list_(pa.null()) if new == "array" else pa.struct([])))
        return True

    def _widen(self, data: bytes, text: str, piece: Piece) -> None:
        """An integer leaf met a decimal (or an integer beyond int64): pyarrow does not say
        which, so integer leaves become float64 one by one (those read as numbers first)
        until that number reads."""
        for node in sorted((n for n in leaves(self.root) if n.leaf == pa.int64()),
                           key=lambda n: n.text):
            node.leaf = pa.float64()
            try:
                self._read(data)
                return
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                found = _NUMBER.search(str(exc))
                if not found or found.group("text") != text:
                    return  # that number reads now: another problem comes next
        raise Declined(f"{piece.uri}: the number {text} cannot be read natively")

    def _nulls(self, table: pa.Table, piece: Piece, rows: np.ndarray,
               bad: list[int]) -> tuple[pa.Table, np.ndarray]:
        """Drop ``null`` lines (pyarrow: a row of nulls; Spark: a malformed record)."""
        import pyarrow.compute as pc

        if not table.num_columns or table.num_rows == 0:
            return table, rows
        empty = pc.is_null(table.column(0))
        for col in table.columns[1:]:
            empty = pc.and_(empty, pc.is_null(col))
        hits = np.flatnonzero(empty.to_numpy(zero_copy_only=False))
        if not len(hits):
            return table, rows
        null = np.array([self._is_null(piece, int(rows[i])) for i in hits.tolist()], dtype=bool)
        if not null.any():
            return table, rows
        bad.extend(rows[hits[null]].tolist())
        keep = np.ones(len(rows), dtype=bool)
        keep[hits[null]] = False
        return table.filter(pa.array(keep)), rows[keep]

    def _malformed(self, piece: Piece, line: int, bad: list[int]) -> None:
        text = piece.lines.text(line)
        if _spark_reads(text):
            raise Declined(f"{piece.uri}:{piece.number(line)}: a JSON line Spark's "
                           "parser reads and pyarrow's does not")
        bad.append(line)


def _spark_reads(text: str) -> bool:
    """Whether Spark's JSON parser (Jackson: single quotes, NaN/INF allowed, text after the
    object ignored) could read ``text`` as an object, so it is not Spark's malformed record."""
    body = text.strip(" \t\r\n")
    if "'" in body or "INF" in body or "Infinity" in body or "NaN" in body or "\ufffd" in body:
        return True
    try:
        value, _ = json.JSONDecoder().raw_decode(body)
    except ValueError:
        return False
    return isinstance(value, dict)
