"""Spark SQL's ``hash()`` (Murmur3 x86_32, seed 42) over Arrow columns, vectorised in numpy.

The native phase-1 reader (:mod:`shuffled.spark.phase1.native.reader`) assigns hashed partitions in Python; it must put
every row in the partition the JVM path (``pmod(hash(cols), shards)``, see
:func:`shuffled.spark.phase1.jvm.prepare.bucket_column`) would, so that the published shardSpec
(``spark_murmur3_32``) holds whichever path ran. This is Spark's ``Murmur3_x86_32``:

- ``hashLong``: the low then the high 32-bit word mixed in, finalised with length 8;
  ``hashInt`` the one word, length 4; a double is hashed as ``hashLong`` of its bits, a
  float as ``hashInt`` of its bits (one NaN, -0.0 as 0.0);
- ``hashUnsafeBytes`` (strings, UTF-8): 4-byte little-endian blocks, then each remaining
  byte mixed in on its own as a *signed* int (Spark's legacy tail, not the reference one),
  finalised with the byte length;
- columns chain: each column's hash is the seed of the next; a null leaves the seed as is.

All arithmetic is on uint32 arrays, where numpy's wrap-around is Java's int overflow.
Rows are hashed :data:`STEP` at a time through every column, each step in place on two
scratch arrays. Every operation a new array of all the rows, as first written, cost
1.5-1.8x the time (a page-faulted allocation per operation, arrays past the cache):
124 against 70 ns a row of the Druid shape's key, 144 against 95 on a flush as phase 1
holds it (three chunks, a dictionary each, unified first).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEED = 42
_U = np.uint32
_C1, _C2 = _U(0xCC9E2D51), _U(0x1B873593)
_H5, _HC = _U(5), _U(0xE6546B64)
_F1, _F2 = _U(0x85EBCA6B), _U(0xC2B2AE35)

#: Rows hashed at a time through every column: a step's scratch arrays stay in the cache.
STEP = 1 << 15

#: A string column whose dictionary is larger than this (keys that never fold: unique ids)
#: is prepared :data:`ROWS_AT_A_TIME` rows at a time, each slice with a dictionary of its
#: own values: the per-value words take the dictionary's size per 4-byte block. Whole, a
#: flush of 1.5M unique ids took ~180 MiB of numpy arrays, and a 2M-row one ~390 MiB.
ROWS_AT_A_TIME = 1 << 17


# -- the mixing steps, in place (``t`` is scratch of the same length) ----------------------

def _mix_k1(k: np.ndarray, t: np.ndarray) -> None:
    """``k = rotl(k * C1, 15) * C2``."""
    np.multiply(k, _C1, out=k)
    np.right_shift(k, _U(17), out=t)
    np.left_shift(k, _U(15), out=k)
    np.bitwise_or(k, t, out=k)
    np.multiply(k, _C2, out=k)


def _mix_h1(h: np.ndarray, k: np.ndarray, t: np.ndarray) -> None:
    """``h = rotl(h ^ k, 13) * 5 + 0xE6546B64``."""
    np.bitwise_xor(h, k, out=h)
    np.right_shift(h, _U(19), out=t)
    np.left_shift(h, _U(13), out=h)
    np.bitwise_or(h, t, out=h)
    np.multiply(h, _H5, out=h)
    np.add(h, _HC, out=h)


def _fmix(h: np.ndarray, length: np.ndarray | np.uint32, t: np.ndarray) -> None:
    np.bitwise_xor(h, length, out=h)
    for shift, factor in ((16, _F1), (13, _F2)):
        np.right_shift(h, _U(shift), out=t)
        np.bitwise_xor(h, t, out=h)
        np.multiply(h, factor, out=h)
    np.right_shift(h, _U(16), out=t)
    np.bitwise_xor(h, t, out=h)


def _valid(arr: pa.Array) -> np.ndarray | None:
    """Each row's validity; None when there are no nulls."""
    if arr.null_count == 0:
        return None
    return pc.is_valid(arr).to_numpy(zero_copy_only=False)


# -- the columns ---------------------------------------------------------------------------

class _Column:
    """One column prepared for hashing rows ``base ..``: :meth:`apply` mixes rows
    ``lo .. hi`` into ``h`` (their running hashes); a null row leaves its hash as it is."""

    base = 0
    valid: np.ndarray | None = None

    def apply(self, h: np.ndarray, lo: int, hi: int, k: np.ndarray, t: np.ndarray) -> None:
        if self.valid is None:
            self._mix(h, lo - self.base, hi - self.base, k, t)
            return
        kept = h.copy()
        self._mix(h, lo - self.base, hi - self.base, k, t)
        np.copyto(h, kept, where=~self.valid[lo - self.base: hi - self.base])

    def _mix(self, h: np.ndarray, lo: int, hi: int, k: np.ndarray, t: np.ndarray) -> None:
        raise NotImplementedError


class _Words(_Column):
    """``hashLong`` (two words, low then high, length 8) or ``hashInt`` (one, length 4)
    of each row's bits."""

    def __init__(self, bits: np.ndarray, wide: bool, valid: np.ndarray | None) -> None:
        if wide:
            # The low and high words as strided views of the bits, no copies.
            pairs = np.ascontiguousarray(bits, dtype=np.int64).view(_U).reshape(-1, 2)
            low, high = (0, 1) if sys.byteorder == "little" else (1, 0)
            self.words = [pairs[:, low], pairs[:, high]]
        else:
            self.words = [bits.astype(np.int32, copy=False).view(_U)]
        self.length = _U(4 * len(self.words))
        self.valid = valid

    def _mix(self, h: np.ndarray, lo: int, hi: int, k: np.ndarray, t: np.ndarray) -> None:
        for word in self.words:
            np.copyto(k, word[lo:hi])
            _mix_k1(k, t)
            _mix_h1(h, k, t)
        _fmix(h, self.length, t)


def _float_bits(arr: pa.Array) -> tuple[np.ndarray, bool]:
    """The bits Spark hashes of a float or double column (Java's ``floatToIntBits`` /
    ``doubleToLongBits``: every NaN one NaN; -0.0 as 0.0, which Spark's hash
    normalises), nulls as 0; and whether they are 64-bit."""
    wide = pa.types.is_float64(arr.type)
    values = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(
        np.float64 if wide else np.float32)
    values = np.where(values == 0, values.dtype.type(0), values)  # -0.0 -> 0.0
    bits = values.view(np.int64 if wide else np.int32).copy()
    bits[np.isnan(values)] = 0x7FF8000000000000 if wide else 0x7FC00000
    return bits, wide


@dataclass(frozen=True)
class _Entries:
    """The seed-independent part of hashing each dictionary entry, computed once per entry.

    Entries are ranked by block count, longest first, so that the entries having a block
    ``b`` are ranks ``0 .. len(blocks[b])``: ``blocks[b][r]`` is block ``b`` of rank ``r``
    through ``mix_k1``. (Stored this way the words take the dictionary's size; a dense
    (longest string x entries) matrix would take gigabytes for one long value among many.)
    ``tails[t][e]`` is tail byte ``t`` of entry ``e`` through ``mix_k1`` (at most 3).
    """

    rank: np.ndarray  # entry -> rank
    blocks: list[np.ndarray]
    tails: np.ndarray
    lengths: np.ndarray  # UTF-8 bytes per entry


def _entries(values: pa.Array) -> _Entries:
    arr = values
    wide = np.int64 if pa.types.is_large_string(arr.type) else np.int32  # no cast: no copy
    offsets = np.frombuffer(arr.buffers()[1], dtype=wide)[
        arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = (offsets[1:] - starts).astype(np.int64)
    count = lengths // 4
    by_rank = np.argsort(-count, kind="stable")
    rank = np.empty(len(arr), dtype=np.int64)
    rank[by_rank] = np.arange(len(arr), dtype=np.int64)
    descending = count[by_rank]
    blocks: list[np.ndarray] = []
    for b in range(int(descending[0]) if len(arr) else 0):
        # Ranks with more than b blocks: a prefix (descending[] is non-increasing).
        at = starts[by_rank[: int(np.searchsorted(-descending, -b, side="left"))]] + 4 * b
        k = (data[at].astype(_U) | (data[at + 1].astype(_U) << _U(8))
             | (data[at + 2].astype(_U) << _U(16)) | (data[at + 3].astype(_U) << _U(24)))
        _mix_k1(k, np.empty_like(k))
        blocks.append(k)
    tail = lengths % 4
    tails = np.zeros((int(tail.max()) if len(arr) else 0, len(arr)), dtype=_U)
    for t in range(tails.shape[0]):  # the legacy tail: each leftover byte, sign-extended
        rows = np.flatnonzero(tail > t)
        k = data[starts[rows] + 4 * count[rows] + t].view(np.int8).astype(np.int32).view(_U)
        _mix_k1(k, np.empty_like(k))
        tails[t, rows] = k
    return _Entries(rank, blocks, tails, lengths)


class _Strings(_Column):
    """``hashUnsafeBytes`` of each row's UTF-8 value: the per-value work (its blocks and
    tail bytes through ``mix_k1``) once per dictionary entry, the per-row mixing in steps."""

    def __init__(self, arr: pa.DictionaryArray, base: int = 0) -> None:
        dictionary = arr.dictionary
        if not (pa.types.is_string(dictionary.type) or pa.types.is_large_string(dictionary.type)):
            raise TypeError(f"no Spark-compatible hash for Arrow type {arr.type}")
        valid = _valid(arr)
        if dictionary.null_count:
            of_values = _valid(dictionary.take(arr.indices.fill_null(0)))
            valid = of_values if valid is None else valid & of_values
        self.base, self.valid = base, valid
        # The indices as Arrow holds them (no copy without nulls): a prepared column
        # lives while every other column of the step is mixed.
        self.idx = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
        self.entries = _entries(dictionary) if len(dictionary) else None
        if self.entries is not None:
            lengths = self.entries.lengths
            # One length for every value (codes, ids of fixed width): no per-row lengths,
            # tails or selections.
            self.one_length = _U(lengths[0]) if bool((lengths == lengths[0]).all()) else None
            self.lengths = lengths.astype(_U)
            self.tail = lengths % 4

    def _mix(self, h: np.ndarray, lo: int, hi: int, k: np.ndarray, t: np.ndarray) -> None:
        e = self.entries
        if e is None:  # every row null
            return
        idx = self.idx[lo:hi]
        ranks = e.rank[idx] if e.blocks else idx
        for words in e.blocks:
            if len(words) == len(e.rank):  # every entry has this block: no selection
                np.take(words, ranks, out=k, mode="clip")  # "raise" buffers the output
                _mix_h1(h, k, t)
            else:
                rows = np.flatnonzero(ranks < len(words))
                sub = h[rows]
                _mix_h1(sub, words[ranks[rows]], np.empty_like(sub))
                h[rows] = sub
        tail = None if self.one_length is not None else self.tail[idx]
        for b in range(e.tails.shape[0]):
            np.take(e.tails[b], idx, out=k, mode="clip")
            if tail is None:
                _mix_h1(h, k, t)
            else:
                kept = h.copy()
                _mix_h1(h, k, t)
                np.copyto(h, kept, where=tail <= b)
        _fmix(h, self.one_length if self.one_length is not None else self.lengths[idx], t)


def _prepared(arr: pa.Array, lo: int = 0, n: int | None = None) -> _Column:
    """``arr`` (rows ``lo ..`` of it, ``n`` of them) prepared for :func:`spark_hash`."""
    if n is not None:
        arr = arr.slice(lo, n)
    if pa.types.is_int64(arr.type):
        values = arr.fill_null(0).to_numpy(zero_copy_only=False)
        column: _Column = _Words(values, True, _valid(arr))
    elif pa.types.is_floating(arr.type) and not pa.types.is_float16(arr.type):
        bits, wide = _float_bits(arr)
        column = _Words(bits, wide, _valid(arr))
    elif (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
          or pa.types.is_dictionary(arr.type)):
        if not pa.types.is_dictionary(arr.type):
            arr = pc.dictionary_encode(arr)
        elif n is not None:  # its own values only
            arr = pc.dictionary_encode(arr.dictionary.take(arr.indices))
        column = _Strings(arr)
    else:
        raise TypeError(f"no Spark-compatible hash for Arrow type {arr.type}")
    column.base = lo
    return column


def _big_dictionary(arr: pa.Array, n: int) -> bool:
    return (n > ROWS_AT_A_TIME and pa.types.is_dictionary(arr.type)
            and len(arr.dictionary) > ROWS_AT_A_TIME)


def _aligned_chunks(columns: list[pa.Array | pa.ChunkedArray]) -> bool:
    """Whether every column is chunked, in more than one chunk, at the same rows."""
    if not columns or not all(isinstance(c, pa.ChunkedArray) for c in columns):
        return False
    lengths = [[len(x) for x in c.chunks] for c in columns]
    return len(lengths[0]) > 1 and all(ls == lengths[0] for ls in lengths)


def spark_hash(columns: list[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``hash(c1, c2, ...)`` of each row, as int32."""
    n = len(columns[0]) if columns else 0
    if _aligned_chunks(columns):
        # Chunk by chunk, each with its own dictionaries: combining the chunks first
        # unified them (a flush of the Druid shape: 6 of its 40 ms).
        chunks = [[c.chunk(i) for c in columns]
                  for i in range(columns[0].num_chunks)]
        return np.concatenate([spark_hash(list(chunk)) for chunk in chunks])
    arrays = []
    for col in columns:
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if pa.types.is_dictionary(arr.type) and pa.types.is_integer(arr.type.value_type):
            arr = arr.cast(arr.type.value_type)
        arrays.append(arr)
    if (any(pa.types.is_string(a.type) or pa.types.is_large_string(a.type) for a in arrays)
            and n > ROWS_AT_A_TIME):
        # A plain string column of many rows: encoded once whole; past the bound, its
        # dictionary is prepared a slice at a time (below).
        arrays = [pc.dictionary_encode(a) if pa.types.is_string(a.type)
                  or pa.types.is_large_string(a.type) else a for a in arrays]
    whole = [None if _big_dictionary(a, n) else _prepared(a) for a in arrays]
    out = np.empty(n, _U)
    k, t = np.empty(min(n, STEP), _U), np.empty(min(n, STEP), _U)
    for outer in range(0, n, ROWS_AT_A_TIME):
        upto = min(n, outer + ROWS_AT_A_TIME)
        prepared = [c if c is not None else _prepared(a, outer, upto - outer)
                    for a, c in zip(arrays, whole, strict=True)]
        for lo in range(outer, upto, STEP):
            hi = min(upto, lo + STEP)
            h = out[lo:hi]
            h.fill(SEED)
            for column in prepared:
                column.apply(h, lo, hi, k[: hi - lo], t[: hi - lo])
    return out.view(np.int32)


def pmod_hash(columns: list[pa.Array | pa.ChunkedArray], shards: np.ndarray | np.int64,
              ) -> np.ndarray:
    """``pmod(hash(columns), shards)`` per row (``shards`` broadcast, all > 0), as int32."""
    return np.mod(spark_hash(columns).astype(np.int64), shards).astype(np.int32)
