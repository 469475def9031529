"""Newline-delimited text read natively: byte blocks cut at line boundaries, line indexes.

A text file is planned as fixed-size byte *blocks* (the driver needs only its size); a task
reading blocks ``[k, m)`` reads the lines that START in ``[k * size, m * size)`` (the line
under way at the first byte is the previous block's), so every line is read by exactly one
task wherever the blocks fall. Lines are ``\\n``-terminated; a ``\\r\\n`` ending is the same
line, as Spark's text reader has it. A lone ``\\r`` (which Spark also takes for a line end)
is not read natively: :class:`Declined`.

Line numbers (for bad rows only) are counted lazily: the newlines before a block are
counted only when one of its lines is reported.

A compressed file (:mod:`shuffled.spark.fs.compressed`) cannot be read from the middle: it
is one split, streamed through its codec (:func:`stream_pieces`). The first lines a CSV's
``skipHeaderRows`` names are never read as rows (``skip``: the bytes they take). What a task
reads is counted in a :class:`ByteMeter` (Druid's processedBytes: the input's bytes, after
decompression).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from shuffled.spark.fs import compressed, remote

#: Bytes read (and parsed) at a time: large enough for Arrow's readers to run at speed,
#: small enough to bound a task's memory.
PIECE = 8 << 20
_JSON_SPACE = np.zeros(256, dtype=bool)
_JSON_SPACE[[9, 10, 13, 32]] = True


class Declined(Exception):
    """The input holds something the native reader does not compute exactly as the JVM
    reader would (the message says what and where): phase 1 runs through the JVM instead."""


class Source:
    """Random-access reads of one local file or object (HTTP: fetched once, whole)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._http: bytes | None = None
        self._file: pa.NativeFile | None = None

    def read(self, start: int, size: int) -> bytes:
        if remote.scheme(self.path) in ("http", "https"):
            if self._http is None:
                with urllib.request.urlopen(self.path, timeout=remote.HTTP_TIMEOUT) as resp:  # noqa: S310
                    self._http = resp.read()
            return self._http[start:start + size]
        if self._file is None:
            self._file = remote.open_random(self.path)
        return self._file.read_at(size, start) if size > 0 else b""

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def file_uri(path: str) -> str:
    """The file name the JVM reader reports: Spark's ``_metadata.file_path`` (a local path
    as a ``file:`` URI, characters java.net.URI quotes in a path percent-encoded)."""
    if remote.is_remote(path):
        return path
    keep = set("/;:@&=+$,-_.!~*'()")
    return "file:" + "".join(c if (not c.isascii() or c.isalnum() or c in keep)
                             else "".join(f"%{b:02X}" for b in c.encode()) for c in path)


@dataclass
class Piece:
    """Whole lines of a file: ``data`` starts at byte ``offset``; line numbers through
    ``counter`` (the 1-based number of the piece's first line, counted when asked)."""

    data: bytes
    offset: int
    uri: str
    counter: LineCounter
    line_map: np.ndarray | None = None  # lines of another piece these are (a selection)

    @cached_property
    def lines(self) -> Lines:
        return Lines(self.data)

    @cached_property
    def newlines(self) -> np.ndarray:
        """Offsets of the piece's newlines (numpy: faster than bytes.count and find)."""
        return np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8) == 10)

    @cached_property
    def count(self) -> int:
        """Lines in the piece (the last may lack its newline)."""
        return len(self.newlines) + (0 if self.data.endswith(b"\n") else 1)

    @cached_property
    def empty_lines(self) -> bool:
        """Whether a line is empty (two newlines in a row, or one first)."""
        nl = self.newlines
        return bool(len(nl)) and (nl[0] == 0 or bool((np.diff(nl) == 1).any()))

    def first_line(self) -> int:
        return self.counter.line_at(self.offset)

    def number(self, line: int) -> int:
        """The 1-based line number in the file of the piece's line ``line``."""
        return self.first_line() + int(line if self.line_map is None else self.line_map[line])

    def select(self, keep: np.ndarray) -> Piece:
        """A piece of only the lines ``keep`` (each with its newline), numbered as here."""
        lines = self.lines
        raw = np.frombuffer(self.data + b"\n", dtype=np.uint8)
        starts = lines.starts[keep]
        lengths = lines.ends[keep] - starts + 1
        shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        data = raw[shift + np.arange(int(lengths.sum()))].tobytes()
        mapped = keep if self.line_map is None else self.line_map[keep]
        return Piece(data, self.offset, self.uri, self.counter, mapped)


class LineCounter:
    """1-based line numbers of offsets in one file, from one count of the bytes before the
    task's first block (done only if asked) and the pieces read since."""

    def __init__(self, source: Source, start: int) -> None:
        self.source, self.start = source, start
        self._before: int | None = None
        self._seen: list[tuple[int, int]] = []  # (piece offset, newlines before it since start)

    def add(self, offset: int, newlines_before: int) -> None:
        self._seen.append((offset, newlines_before))

    def line_at(self, offset: int) -> int:
        if self._before is None:
            self._before, pos = 0, 0
            while pos < self.start:
                chunk = self.source.read(pos, min(PIECE, self.start - pos))
                if not chunk:
                    break
                self._before += chunk.count(b"\n")
                pos += len(chunk)
        since = dict(self._seen)[offset]
        return self._before + since + 1


class Lines:
    """Line boundaries of a piece (numpy over its bytes): starts, ends (before ``\\r\\n``)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        raw = np.frombuffer(data, dtype=np.uint8)
        newlines = np.flatnonzero(raw == 10)
        ends = newlines if (len(data) == 0 or data[-1] == 10) else np.append(newlines, len(data))
        self.starts = np.concatenate([[0], newlines + 1])[: len(ends)].astype(np.int64)
        self.ends = ends.astype(np.int64)
        self.count = len(self.ends)
        self._raw = raw

    def text(self, i: int) -> str:
        """Line ``i`` as the JVM reader's ``value`` (no terminator, bad UTF-8 replaced)."""
        line = self.data[self.starts[i]:self.ends[i]]
        return line[:-1].decode("utf-8", "replace") if line.endswith(b"\r") else line.decode(
            "utf-8", "replace")

    @cached_property
    def visible(self) -> np.ndarray:
        """Count of non-whitespace (JSON whitespace) bytes of each line."""
        solid = np.concatenate([[0], np.cumsum(~_JSON_SPACE[self._raw], dtype=np.int64)])
        return solid[self.ends] - solid[self.starts]

    @cached_property
    def spaces_only(self) -> np.ndarray:
        """Lines the JVM reader skips: empty or only spaces (``trim(value) = ''``)."""
        other = np.concatenate([[0], np.cumsum(self._raw != 32, dtype=np.int64)])
        cr = (self.ends > self.starts) & (self._raw[np.maximum(self.ends - 1, 0)] == 13)
        return (other[self.ends] - other[self.starts] - cr) == 0

    def strings(self) -> pa.Array:
        """Every line as one Arrow string (its terminator included), without a copy."""
        offsets = np.append(self.starts, len(self.data)).astype(np.int32 if len(self.data) < (1 << 31) else np.int64)
        typ = pa.string() if offsets.dtype == np.int32 else pa.large_string()
        return pa.Array.from_buffers(typ, self.count, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(self.data)])


@dataclass
class ByteMeter:
    """Bytes of input a task has read (decompressed): its share of processedBytes."""

    bytes: int = 0


def skipped_bytes(path: str, lines: int) -> int:
    """Bytes the first ``lines`` lines of ``path`` take (decompressed), newlines included."""
    if lines <= 0:
        return 0
    taken = seen = 0
    with remote.open_stream(path) as raw:
        while chunk := raw.read(1 << 16):
            at = -1
            while seen < lines:
                at = chunk.find(b"\n", at + 1)
                if at < 0:
                    break
                seen += 1
            if seen == lines:
                return taken + at + 1
            taken += len(chunk)
    return taken


def pieces(path: str, block: int, blocks: list[tuple[int, int]], skip: int = 0,
           meter: ByteMeter | None = None) -> Iterator[Piece]:
    """The lines starting in each ``[first, end)`` range of blocks of ``path``, in pieces
    of about :data:`PIECE` bytes (a longer line is one piece); none of the first ``skip``
    bytes (whole lines: skipHeaderRows), which the task reading from the start counts."""
    if compressed.codec(path):
        yield from stream_pieces(path, skip, meter)
        return
    source = Source(path)
    uri = file_uri(path)
    meter = meter if meter is not None else ByteMeter()
    try:
        for first, end in blocks:
            start, stop = first * block, end * block
            pos = start
            if start > 0:  # the line under way at `start` belongs to the block before
                after = _next_line(source, start - 1)
                if after is None:
                    continue
                pos = after
            elif skip:
                meter.bytes += skip
            pos = max(pos, skip)
            counter = LineCounter(source, pos)
            newlines = 0
            while pos < stop:
                data = source.read(pos, PIECE)
                if not data:
                    break
                data = _whole_lines(source, pos, data, stop)
                if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
                    raise Declined(f"{uri}: a line ends with a lone carriage return")
                counter.add(pos, newlines)
                piece = Piece(data, pos, uri, counter)
                meter.bytes += len(data)
                yield piece
                newlines += piece.count - (0 if data.endswith(b"\n") else 1)
                pos += len(data)
    finally:
        source.close()


def stream_pieces(path: str, skip: int = 0, meter: ByteMeter | None = None) -> Iterator[Piece]:
    """The lines of a compressed ``path`` after its first ``skip`` bytes, streamed through
    its codec in pieces of whole lines (one task reads the whole file)."""
    uri = file_uri(path)
    meter = meter if meter is not None else ByteMeter()
    counter = LineCounter(Source(path), 0)  # from the start: never reads the file
    pos, newlines, held = 0, 0, b""
    with remote.open_stream(path) as raw:
        while True:
            chunk = raw.read(PIECE)
            meter.bytes += len(chunk)
            held += chunk
            if chunk:
                cut = held.rfind(b"\n")
                if cut < 0:
                    continue
                data, held = held[: cut + 1], held[cut + 1:]
            else:
                data, held = held, b""
            if pos < skip:  # skipHeaderRows: whole lines, never rows
                drop = min(skip - pos, len(data))
                newlines += data.count(b"\n", 0, drop)
                pos += drop
                data = data[drop:]
            if data:
                if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
                    raise Declined(f"{uri}: a line ends with a lone carriage return")
                counter.add(pos, newlines)
                piece = Piece(data, pos, uri, counter)
                yield piece
                newlines += piece.count - (0 if data.endswith(b"\n") else 1)
                pos += len(data)
            if not chunk:
                return


def _next_line(source: Source, pos: int) -> int | None:
    """The offset after the first newline at or after ``pos`` (None at the end)."""
    while True:
        chunk = source.read(pos, 1 << 16)
        if not chunk:
            return None
        at = chunk.find(b"\n")
        if at >= 0:
            return pos + at + 1
        pos += len(chunk)


def _whole_lines(source: Source, pos: int, data: bytes, stop: int) -> bytes:
    """``data`` (read at ``pos``) cut after its last whole line, and after the last line
    starting before ``stop``; a line longer than ``data`` is read to its end."""
    if pos + len(data) > stop:
        at = data.find(b"\n", max(stop - 1 - pos, 0))
        return data if at < 0 and len(data) < PIECE else (
            data[: at + 1] if at >= 0 else _whole_lines(source, pos, data + source.read(
                pos + len(data), PIECE), stop))
    cut = data.rfind(b"\n")
    if cut >= 0:
        return data[: cut + 1]
    more = source.read(pos + len(data), PIECE)
    return data if not more else _whole_lines(source, pos, data + more, stop)
