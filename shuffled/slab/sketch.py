"""A slab's statistics per time chunk, bounded whatever the input: its rows and a
HyperLogLog of its rolled-up keys (2^11 one-byte registers: about 2.3% standard error),
merged chunk by chunk (registers by maximum). The format's per-chunk key sample is written
empty: range bounds come from phase 1's sample of distinct rolled-up rows
(:class:`shuffled.spark.phase1.slabs.KeySample`), which travels with the task's report.

Vectorised with numpy: no Python per row. The row hash is 64 bits, mixed with
SplitMix64's finaliser (Steele et al., "Fast splittable pseudorandom number generators").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.slab.wire import LG_REGISTERS, STATS_SCHEMA  # noqa: F401 (re-exported)

REGISTERS = 1 << LG_REGISTERS

_U64 = np.uint64
_M1, _M2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_GOLDEN = _U64(0x9E3779B97F4A7C15)


def _mix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = (h ^ (h >> _U64(30))) * _M1
        h = (h ^ (h >> _U64(27))) * _M2
        return h ^ (h >> _U64(31))


def rate_threshold(rate: float) -> np.uint64:
    """The 64-bit hash below which a row is in a sample at ``rate`` (0 to 1)."""
    return _U64(min(int(rate * 2.0 ** 64), 2 ** 64 - 1))


#: At most this many distinct value lengths are summed a length at a time (:func:`_bytes_hash`).
LENGTH_GROUPS = 16


def _bytes_hash(column: pa.Array) -> np.ndarray:
    """A 64-bit hash per value of a string/binary column (nulls hash alike, apart from "")."""
    arr = pc.cast(column, pa.large_binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    base = int(offsets[0])
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] is not None \
        else np.zeros(0, np.uint8)
    data = data[base: int(offsets[-1])]
    lengths = np.diff(offsets)
    out = lengths.astype(_U64) * _GOLDEN
    if len(data):
        powers = np.ones(int(lengths.max()), dtype=_U64)
        with np.errstate(over="ignore"):
            if len(powers) > 1:
                powers[1:] = _U64(1099511628211)
                powers = np.cumprod(powers, dtype=_U64)
            sizes = np.unique(lengths)
            if len(sizes) <= LENGTH_GROUPS:
                # Values of one length as the rows of a matrix, their sums one product
                # (uint64, wrapping as the sums below do): ids and codes come in few
                # lengths, and this is 3x the byte-at-a-time sums' speed on them.
                for size in sizes[sizes > 0].tolist():
                    rows = np.flatnonzero(lengths == size)
                    block = data[(offsets[rows] - base)[:, None] + np.arange(size)]
                    out[rows] += (block.astype(_U64) + _U64(1)) @ powers[:size]
            else:
                wide = data.astype(_U64)
                starts = np.repeat(offsets[:-1] - base, lengths)
                rel = np.arange(len(data), dtype=np.int64) - starts
                terms = (wide + _U64(1)) * powers[rel]
                nonempty = lengths > 0
                sums = np.add.reduceat(terms, (offsets[:-1] - base)[nonempty])
                out[nonempty] += sums
    if arr.null_count:
        out[np.asarray(arr.is_null(), dtype=bool)] = _NULL_HASH
    return _mix(out)


_NULL_HASH = _U64(0x5BD1E995)  # what _bytes_hash gives a null before mixing


def _distinct_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string/binary column (maybe dictionary-encoded) as (each distinct value's
    :func:`_bytes_hash`, a null's hash last; each row's index into them): the per-byte
    arithmetic is the cost, and a slab's dimension columns repeat their values (measured
    16x faster on 375,000 users of 16,623)."""
    enc = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    if len(enc.dictionary) > len(enc):  # a dictionary bigger than the column: decode it
        enc = pc.dictionary_encode(enc.dictionary_decode())
    values = np.append(_bytes_hash(enc.dictionary), _mix(np.array([_NULL_HASH], _U64)))
    # An all-null column (a file without the dimension) has an empty dictionary. Narrow
    # indices are widened: the null's slot may not fit them.
    indices = enc.indices if enc.indices.type.bit_width >= 32 else enc.indices.cast(pa.int32())
    idx = indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False)
    return values, idx


def _distinct_hash(column: pa.Array) -> np.ndarray:
    """:func:`_bytes_hash` of each row of a string/binary column, each distinct value
    hashed once (:func:`_distinct_parts`)."""
    values, idx = _distinct_parts(column)
    return values[idx]


def _is_distinct(column: pa.Array) -> bool:
    """Whether :func:`_column_hash` hashes ``column`` a distinct value at a time: strings
    and bytes, dictionary-encoded or past 64 rows."""
    typ = column.type
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    elif len(column) <= 64:
        return False
    return (pa.types.is_string(typ) or pa.types.is_binary(typ) or pa.types.is_large_string(typ)
            or pa.types.is_large_binary(typ))


def _column_hash(column: pa.Array) -> np.ndarray:
    if _is_distinct(column):
        return _distinct_hash(column)
    if pa.types.is_dictionary(column.type):  # of other values than strings
        column = column.dictionary_decode()
    typ = column.type
    if pa.types.is_date32(typ):  # days: Arrow casts them to int32, not to int64
        column, typ = pc.cast(column, pa.int32()), pa.int32()
    if pa.types.is_integer(typ) or pa.types.is_timestamp(typ) or pa.types.is_date(typ):
        values = pc.cast(column, pa.int64()) if not pa.types.is_int64(typ) else column
        raw = np.asarray(values.fill_null(-0x7FFF_FFFF_FFFF_FFF1)).view(_U64)
        return _mix(raw + _GOLDEN)
    if pa.types.is_floating(typ):
        raw = np.asarray(pc.cast(column, pa.float64()).fill_null(np.nan)).view(_U64)
        return _mix(raw + _GOLDEN)
    return _bytes_hash(column if not pa.types.is_boolean(typ) else pc.cast(column, pa.string()))


#: Rows hashed at a time through every column, in place on scratch arrays that stay in
#: the cache (as :mod:`shuffled.spark.phase1.spark_compat.murmur3` does): an array of all
#: the rows for every operation was 73 ns a row of the Druid shape's key, this 31.
STEP = 1 << 15


def _mix_into(h: np.ndarray, t: np.ndarray) -> None:
    """:func:`_mix` of ``h`` in place (``t``: scratch of its length)."""
    for shift, factor in ((30, _M1), (27, _M2)):
        np.right_shift(h, _U64(shift), out=t)
        np.bitwise_xor(h, t, out=h)
        np.multiply(h, factor, out=h)
    np.right_shift(h, _U64(31), out=t)
    np.bitwise_xor(h, t, out=h)


def row_hashes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """A 64-bit hash per row of the tuple ``columns`` hold (the rolled-up key): the first
    column's hash, then ``mix(h * 31 + hash)`` of each next one."""
    if not columns:
        raise ValueError("row_hashes needs at least one column")
    # (Not chunk by chunk with each chunk's dictionary, as the Spark hash is: a flush's
    # chunks share most values, and hashing each value's bytes once a chunk cost twice
    # what unifying the dictionaries does.)
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    # Per column: (distinct values' hashes, each row's index) or each row's hash.
    parts = [_distinct_parts(a) if _is_distinct(a) else (_column_hash(a), None)
             for a in arrays]
    n = len(arrays[0])
    out = np.empty(n, _U64)
    k, t = np.empty(min(n, STEP), _U64), np.empty(min(n, STEP), _U64)
    with np.errstate(over="ignore"):
        for lo in range(0, n, STEP):
            hi = min(n, lo + STEP)
            h, kk, tt = out[lo:hi], k[: hi - lo], t[: hi - lo]
            for i, (values, idx) in enumerate(parts):
                if idx is None:
                    ch = values[lo:hi]
                else:
                    np.take(values, idx[lo:hi], out=kk, mode="clip")  # "raise" buffers
                    ch = kk
                if i == 0:
                    np.copyto(h, ch)
                    continue
                np.multiply(h, _U64(31), out=h)
                np.add(h, ch, out=h)
                _mix_into(h, tt)
    return out


def _rho(hashes: np.ndarray) -> np.ndarray:
    """Each hash's register value: 1 + the leading zeros of its bits after the register's
    11, a stop bit after them (so 1 to 54), read exactly from a float64's exponent: those
    53 bits convert without rounding. ``log2`` of the 64 (the bits, then the stop bit)
    rounded 54 significant bits to 53: bits all ones became 2^64, and the register 0."""
    low = (hashes & _U64((1 << (64 - LG_REGISTERS)) - 1)).view(np.int64)
    exponent = (low.astype(np.float64).view(np.int64) >> np.int64(52)) - np.int64(1023)
    # zero's exponent field is 0 (-1023 here): its value is the stop bit's, 54
    rho = np.minimum(np.int64(64 - LG_REGISTERS) - exponent, np.int64(65 - LG_REGISTERS))
    return rho.astype(np.uint8)


def registers(hashes: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """HLL registers of rows ``[bounds[i], bounds[i+1])`` for each i: shape (chunks, 2^11)."""
    chunks = len(bounds) - 1
    out = np.zeros((chunks, REGISTERS), dtype=np.uint8)
    if not len(hashes):
        return out
    bucket = (hashes >> _U64(64 - LG_REGISTERS)).astype(np.int64)
    rho = _rho(hashes)
    chunk_of = np.repeat(np.arange(chunks, dtype=np.int64), np.diff(bounds))
    np.maximum.at(out.reshape(-1), chunk_of * REGISTERS + bucket, rho)
    return out


_PAIR = np.dtype([("at", "<u2"), ("rho", "u1")])


def encode_registers(regs: np.ndarray) -> bytes:
    """A chunk's registers as stored: dense (2^11 bytes) or, when fewer than a third are
    set, sparse (3 bytes per set register: its index u16 little-endian, its value). A
    small chunk (most day chunks of a Druid spec) then costs bytes, not 2 KiB: the lengths
    never collide (3k is never 2048)."""
    at = np.flatnonzero(regs)
    if 3 * len(at) >= REGISTERS:
        return regs.astype(np.uint8).tobytes()
    pairs = np.empty(len(at), _PAIR)
    pairs["at"] = at
    pairs["rho"] = regs[at]
    return pairs.tobytes()


def decode_registers(raw: bytes) -> np.ndarray:
    """The registers :func:`encode_registers` stored; ValueError for bytes it cannot have
    written."""
    if len(raw) == REGISTERS:
        return np.frombuffer(raw, np.uint8).copy()
    if len(raw) % 3 or 3 * (len(raw) // 3) >= REGISTERS:
        raise ValueError(f"HLL registers of {len(raw)} bytes are neither dense nor sparse")
    pairs = np.frombuffer(raw, _PAIR)
    if len(pairs) and int(pairs["at"].max()) >= REGISTERS:
        raise ValueError("sparse HLL registers name a register past 2^11")
    regs = np.zeros(REGISTERS, np.uint8)
    regs[pairs["at"]] = pairs["rho"]
    return regs


def decode_all(raw: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decode_registers` of every value of a binary array at once: (registers,
    chunks x 2^11; whether each value held any bytes). Per value, an Arrow scalar and
    a decode each were 63 of a range spec's ~600 slab samples; ValueError as there."""
    n = len(raw)
    offsets = np.frombuffer(raw.buffers()[1], np.int32, n + 1, raw.offset * 4).astype(np.int64)
    body = raw.buffers()[2]
    data = np.frombuffer(body, np.uint8) if body is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    dense = lengths == REGISTERS
    sparse = ~dense & (lengths > 0)
    if ((lengths[sparse] % 3 != 0) | (lengths[sparse] >= 3 * ((REGISTERS + 2) // 3))).any():
        raise ValueError("HLL registers whose length is neither dense nor sparse")
    out = np.zeros((n, REGISTERS), np.uint8)
    if dense.any():
        out[dense] = data[offsets[:-1][dense][:, None] + np.arange(REGISTERS)]
    rows = np.flatnonzero(sparse)
    if len(rows):
        pairs = lengths[rows] // 3
        first = np.repeat(offsets[rows] - np.concatenate([[0], np.cumsum(3 * pairs)[:-1]]),
                          pairs)
        at = first + 3 * np.arange(int(pairs.sum()))
        index = data[at].astype(np.int64) | (data[at + 1].astype(np.int64) << 8)
        if len(index) and int(index.max()) >= REGISTERS:
            raise ValueError("sparse HLL registers name a register past 2^11")
        out[np.repeat(rows, pairs), index] = data[at + 2]
    return out, lengths > 0


def estimate(regs: np.ndarray) -> float:
    """The HLL estimate of distinct rows (Flajolet et al. 2007, with linear counting below
    2.5m, as Druid's and DataSketches' HLL do for small sets)."""
    return float(estimate_many(regs.reshape(1, -1))[0])


#: 2^-v for each register value v (a register holds at most 64 - LG_REGISTERS + 1).
_INVERSE = np.exp2(-np.arange(256, dtype=np.float64))
#: Sketches :func:`estimate_many` reads at a time (their 2^-v: 4 MiB of float64).
ESTIMATE_BLOCK = 256


def estimate_many(regs: np.ndarray) -> np.ndarray:
    """:func:`estimate` of each row of ``regs`` (sketches x 2^11), a block of rows at a
    time: per chunk, the estimate was a third of a range plan's reduce (3,652 chunks)."""
    m = float(REGISTERS)
    alpha = 0.7213 / (1 + 1.079 / m)
    out = np.empty(len(regs), np.float64)
    for lo in range(0, len(regs), ESTIMATE_BLOCK):
        block = regs[lo: lo + ESTIMATE_BLOCK]
        raw = alpha * m * m / _INVERSE[block].sum(axis=1)
        zeros = np.count_nonzero(block == 0, axis=1)
        linear = m * np.log(m / np.maximum(zeros, 1))
        out[lo: lo + ESTIMATE_BLOCK] = np.where((raw <= 2.5 * m) & (zeros > 0), linear, raw)
    return out
