"""Spark SQL's ``hash()`` (Murmur3 x86_32, seed 42) over Arrow columns, vectorised in numpy.

The native phase-1 reader (:mod:`.native`) assigns hashed partitions in Python; it must put
every row in the partition the JVM path (``pmod(hash(cols), shards)``, see
:func:`shuffled.spark.prepare.bucket_column`) would, so that the published shardSpec
(``spark_murmur3_32``) holds whichever path ran. This is Spark's ``Murmur3_x86_32``:

- ``hashLong``: the low then the high 32-bit word mixed in, finalised with length 8;
- ``hashUnsafeBytes`` (strings, UTF-8): 4-byte little-endian blocks, then each remaining
  byte mixed in on its own as a *signed* int (Spark's legacy tail, not the reference one),
  finalised with the byte length;
- columns chain: each column's hash is the seed of the next; a null leaves the seed as is.

All arithmetic is on uint32 arrays, where numpy's wrap-around is Java's int overflow.
"""

from __future__ import annotations

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


def _hash_strings(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Murmur3 ``hashUnsafeBytes`` of each (non-null) UTF-8 value with its row's seed."""
    arr = arr.cast(pa.large_string()) if not pa.types.is_large_string(arr.type) else arr
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = (offsets[1:] - starts).astype(np.int64)
    h = seed.copy()
    blocks = lengths // 4
    for b in range(int(blocks.max()) if len(blocks) else 0):
        rows = np.flatnonzero(blocks > b)
        at = starts[rows] + 4 * b
        k = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << np.uint32(8))
             | (data[at + 2].astype(np.uint32) << np.uint32(16))
             | (data[at + 3].astype(np.uint32) << np.uint32(24)))
        h[rows] = _mix_h1(h[rows], _mix_k1(k))
    for t in range(3):  # the legacy tail: each leftover byte, sign-extended, on its own
        rows = np.flatnonzero(lengths % 4 > t)
        if len(rows) == 0:
            break
        byte = data[starts[rows] + 4 * blocks[rows] + t].view(np.int8).astype(np.int32)
        h[rows] = _mix_h1(h[rows], _mix_k1(byte.view(np.uint32)))
    out = _fmix(h, lengths.astype(np.uint32))
    valid = _valid(arr)
    return np.where(valid, out, seed)


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
        if pa.types.is_dictionary(arr.type):
            arr = arr.cast(arr.type.value_type)
        if pa.types.is_int64(arr.type):
            values = arr.fill_null(0).to_numpy(zero_copy_only=False)
            h = np.where(_valid(arr), _hash_long(values, h), h)
        elif pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            h = _hash_strings(arr, h)
        else:
            raise TypeError(f"no Spark-compatible hash for Arrow type {arr.type}")
    return h.view(np.int32)


def pmod_hash(columns: list[pa.Array | pa.ChunkedArray], shards: np.ndarray) -> np.ndarray:
    """``pmod(hash(columns), shards)`` per row (``shards`` broadcast, all > 0), as int32."""
    return np.mod(spark_hash(columns).astype(np.int64), shards).astype(np.int32)
