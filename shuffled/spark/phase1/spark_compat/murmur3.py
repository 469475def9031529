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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEED = 42
_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k: np.ndarray) -> np.ndarray:
    return _rotl(k * _C1, 15) * _C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    return _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h = h ^ np.asarray(length, dtype=np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64, copy=False).view(np.uint64)
    low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (v >> np.uint64(32)).astype(np.uint32)
    h = _mix_h1(seed, _mix_k1(low))
    h = _mix_h1(h, _mix_k1(high))
    return _fmix(h, 8)


def _hash_int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seed, _mix_k1(values.astype(np.uint32, copy=False))), 4)


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
        k = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << np.uint32(8))
             | (data[at + 2].astype(np.uint32) << np.uint32(16))
             | (data[at + 3].astype(np.uint32) << np.uint32(24)))
        blocks.append(_mix_k1(k))
    tail = lengths % 4
    tails = np.zeros((int(tail.max()) if len(arr) else 0, len(arr)), dtype=np.uint32)
    for t in range(tails.shape[0]):  # the legacy tail: each leftover byte, sign-extended
        rows = np.flatnonzero(tail > t)
        byte = data[starts[rows] + 4 * count[rows] + t].view(np.int8).astype(np.int32)
        tails[t, rows] = _mix_k1(byte.view(np.uint32))
    return _Entries(rank, blocks, tails, lengths)


def _mix_blocks(h: np.ndarray, entries: _Entries, idx: np.ndarray) -> np.ndarray:
    """Mix each row's value's 4-byte blocks (row ``r`` holds entry ``idx[r]``) into ``h``."""
    ranks = entries.rank[idx]
    everyone = len(entries.rank)
    for words in entries.blocks:
        if len(words) == everyone:  # every entry has this block: no selection
            h = _mix_h1(h, words[ranks])
        else:
            rows = np.flatnonzero(ranks < len(words))
            h[rows] = _mix_h1(h[rows], words[ranks[rows]])
    return h


def _mix_tails(h: np.ndarray, entries: _Entries, idx: np.ndarray) -> np.ndarray:
    """Mix each row's value's tail bytes into ``h``."""
    tail = (entries.lengths % 4)[idx]
    for t in range(entries.tails.shape[0]):
        k = entries.tails[t][idx]
        h = np.where(tail > t, _mix_h1(h, k), h)
    return h


#: Rows hashed at a time: the per-value work (once per dictionary entry) and the per-row
#: mixing allocate several arrays of their length per 4-byte block, so a column whose
#: dictionary is larger than this (keys that never fold: unique ids) is hashed a slice of
#: rows at a time, each slice with a dictionary of its own values. Whole, a flush of 1.5M
#: unique ids took ~180 MiB of numpy arrays, and a 2M-row one ~390 MiB at the peak.
ROWS_AT_A_TIME = 1 << 17


def _hash_strings(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Murmur3 ``hashUnsafeBytes`` of each (non-null) UTF-8 value with its row's seed.

    The value-only part of the work is done once per distinct value: plain strings are
    dictionary-encoded first, then each row mixes its value's precomputed blocks."""
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    dictionary = arr.dictionary
    if not (pa.types.is_string(dictionary.type) or pa.types.is_large_string(dictionary.type)):
        raise TypeError(f"no Spark-compatible hash for Arrow type {arr.type}")
    valid = _valid(arr)
    if dictionary.null_count:
        valid &= _valid(dictionary.take(arr.indices.fill_null(0)))
    idx = arr.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.intp)
    if len(dictionary) == 0:
        return seed.copy()
    if len(dictionary) > ROWS_AT_A_TIME and len(arr) > ROWS_AT_A_TIME:
        out = np.empty_like(seed)
        for lo in range(0, len(arr), ROWS_AT_A_TIME):
            part = arr.slice(lo, ROWS_AT_A_TIME)
            own = pc.dictionary_encode(part.dictionary.take(part.indices))  # its values only
            out[lo: lo + len(part)] = _hash_strings(own, seed[lo: lo + len(part)])
        return out
    entries = _entries(dictionary)
    lengths = entries.lengths.astype(np.uint32)
    out = np.empty_like(seed)
    for lo in range(0, len(idx), ROWS_AT_A_TIME):
        rows = idx[lo: lo + ROWS_AT_A_TIME]
        h = _mix_tails(_mix_blocks(seed[lo: lo + ROWS_AT_A_TIME].copy(), entries, rows),
                       entries, rows)
        out[lo: lo + len(rows)] = _fmix(h, lengths[rows])
    return out if valid.all() else np.where(valid, out, seed)


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return pc.is_valid(arr).to_numpy(zero_copy_only=False)


def spark_hash(columns: list[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``hash(c1, c2, ...)`` of each row, as int32."""
    n = len(columns[0]) if columns else 0
    h = np.full(n, SEED, dtype=np.uint32)
    for col in columns:
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if pa.types.is_dictionary(arr.type) and pa.types.is_integer(arr.type.value_type):
            arr = arr.cast(arr.type.value_type)
        if pa.types.is_int64(arr.type):
            values = arr.fill_null(0).to_numpy(zero_copy_only=False)
            h = np.where(_valid(arr), _hash_long(values, h), h)
        elif pa.types.is_floating(arr.type) and not pa.types.is_float16(arr.type):
            bits, wide = _float_bits(arr)
            hashed = _hash_long(bits, h) if wide else _hash_int(bits.view(np.uint32), h)
            h = np.where(_valid(arr), hashed, h)
        elif (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
              or pa.types.is_dictionary(arr.type)):
            h = _hash_strings(arr, h)
        else:
            raise TypeError(f"no Spark-compatible hash for Arrow type {arr.type}")
    return h.view(np.int32)


def pmod_hash(columns: list[pa.Array | pa.ChunkedArray], shards: np.ndarray | np.int64,
              ) -> np.ndarray:
    """``pmod(hash(columns), shards)`` per row (``shards`` broadcast, all > 0), as int32."""
    return np.mod(spark_hash(columns).astype(np.int64), shards).astype(np.int32)
