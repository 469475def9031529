"""CSV lines parsed by pyarrow.csv the way Spark's ``from_csv`` reads each line.

Every column is text; an empty value (quoted or not) is null, as Spark reads it. A line
with more or fewer values than columns (or an unterminated quote) is Spark's ``malformed csv
record``; lines of spaces are skipped and lines equal to a header line dropped, as the JVM
reader does. Spark's parser (univocity, escape ``\\``) and pyarrow's agree on plain values
and on ``"quoted, values"``; a line quoting otherwise (a quote inside a value, text after
a closing quote, a backslash in quotes) is not read natively: :class:`.Declined`.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from shuffled.spark.phase1.native.text.blocks import Declined, Piece


def _regular(delimiter: str) -> str:
    """A line whose every value is plain (no quote) or ``"quoted"`` (no quote or backslash
    inside), then the delimiter or the end of the line."""
    d = re.escape(delimiter)
    value = f'(?:[^"{d}\\r\\n]*|"[^"\\\\]*")'
    return f"^{value}(?:{d}{value})*\\r?\\n?$"


def parse_csv(piece: Piece, columns: tuple[str, ...], delimiter: str,
              headers: frozenset[str]) -> tuple[pa.Table, np.ndarray, list[int]]:
    """The rows of ``piece`` (all columns text), each row's line, and malformed lines."""
    data = piece.data
    lines = piece.lines
    if b'"' in data:
        texts = lines.strings()
        quoted = pc.match_substring(texts, '"')
        irregular = pc.and_(quoted, pc.invert(pc.match_substring_regex(texts, _regular(delimiter))))
        hits = np.flatnonzero(pc.fill_null(irregular, False).to_numpy(zero_copy_only=False))
        if len(hits):
            raise Declined(f"{piece.uri}:{piece.first_line() + int(hits[0])}: CSV quoting Spark "
                           "and pyarrow read differently")
    invalid: list[int] = []

    def on_invalid(row: pcsv.InvalidRow) -> str:
        invalid.append(int(row.number) - 1 if row.number is not None else -1)
        return "skip"

    try:
        table = pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(column_names=list(columns), use_threads=False,
                                          block_size=len(data) + 1),
            parse_options=pcsv.ParseOptions(delimiter=delimiter, quote_char='"',
                                            double_quote=False, escape_char=False,
                                            newlines_in_values=False, ignore_empty_lines=True,
                                            invalid_row_handler=on_invalid),
            convert_options=pcsv.ConvertOptions(
                column_types={c: pa.string() for c in columns}, null_values=[""],
                strings_can_be_null=True, quoted_strings_can_be_null=True))
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise Declined(f"{piece.uri}: CSV pyarrow cannot read ({exc})") from None
    if -1 in invalid:
        raise Declined(f"{piece.uri}: a malformed CSV line pyarrow could not place")
    # Rows are the lines pyarrow neither skipped (empty) nor refused (wrong column count);
    # pyarrow numbers a refused row among the lines it did not skip.
    empty = lines.ends - lines.starts - (lines.ends > lines.starts) * _ends_cr(lines) == 0
    used = ~empty
    invalid = np.flatnonzero(used)[invalid].tolist() if invalid else []
    used[invalid] = False
    rows = np.flatnonzero(used)
    if len(rows) != table.num_rows:
        raise Declined(f"{piece.uri}: CSV rows pyarrow could not match with lines")
    bad = [i for i in invalid if not lines.spaces_only[i]]  # Spark skips lines of spaces
    keep = ~lines.spaces_only[rows]
    if headers:
        keep &= ~pc.is_in(_values(lines, rows), pa.array(sorted(headers))).to_numpy(
            zero_copy_only=False)
    if not keep.all():
        table, rows = table.filter(pa.array(keep)), rows[keep]
    return table, rows, sorted(bad)


def _ends_cr(lines: object) -> np.ndarray:
    raw = np.frombuffer(lines.data, dtype=np.uint8)  # type: ignore[attr-defined]
    ends = lines.ends  # type: ignore[attr-defined]
    return (raw[np.maximum(ends - 1, 0)] == 13).astype(np.int64)


def _values(lines: object, rows: np.ndarray) -> pa.Array:
    """The JVM reader's ``value`` of the given lines (no terminator)."""
    texts = lines.strings().take(pa.array(rows))  # type: ignore[attr-defined]
    return pc.replace_substring_regex(texts, r"\r?\n$", "")
