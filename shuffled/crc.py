"""CRC32C helpers: checksum of a buffer and combination of checksums without the data.

``combine`` lets the server give the aggregate stream a Content-Digest computed from the
stored per-file CRCs (zero-copy serving never reads the bytes into Python). The algorithm
shifts crc(A) over len(B) zero bytes, a linear map applied from byte tables of its
power-of-two steps (below).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import crc32c as _crc32c


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (hardware accelerated)."""
    return _crc32c.crc32c(data, value)


#: Up to this length the hardware CRC of zero bytes shifts a CRC faster than the tables.
HW_SHIFT_MAX = 512
_ZEROS = memoryview(bytes(HW_SHIFT_MAX))

# Shifting a CRC over n zero bytes is linear over GF(2): L_n(c) = crc(0^n, c) ^ crc(0^n, 0).
# _SHIFTS[k] holds L_(2^k) as four byte tables (c's bytes looked up and XORed), so
# L_n(c) is one table application per set bit of n. An aggregate GET of 1,000 small
# partials combines 1,000 CRCs before its first byte: a hardware CRC of 2 x len2 zero
# bytes each cost more than sending them (figures: docs/benchmarks.md, serve_small).
_Tables = tuple[list[int], list[int], list[int], list[int]]
_SHIFTS: list[_Tables] = []
_GROWING = threading.Lock()


def _apply(t: _Tables, c: int) -> int:
    return t[0][c & 255] ^ t[1][(c >> 8) & 255] ^ t[2][(c >> 16) & 255] ^ t[3][c >> 24]


def _tables(images: list[int]) -> _Tables:
    """Byte tables of the linear map sending bit i to ``images[i]``."""
    out = []
    for j in range(4):
        table = [0] * 256
        for b in range(1, 256):
            low = b & -b
            table[b] = table[b ^ low] ^ images[8 * j + low.bit_length() - 1]
        out.append(table)
    return out[0], out[1], out[2], out[3]


def _shift(k: int) -> _Tables:
    """L_(2^k), built on first use from L_(2^(k-1)) applied twice. The event loop and the
    I/O threads combine: a level is appended whole and under the lock, so no two threads
    append the same one (which would shift every level after it)."""
    if len(_SHIFTS) <= k:
        with _GROWING:
            while len(_SHIFTS) <= k:
                if not _SHIFTS:
                    zero = _crc32c.crc32c(b"\0", 0)
                    images = [_crc32c.crc32c(b"\0", 1 << i) ^ zero for i in range(32)]
                else:
                    half = _SHIFTS[-1]
                    images = [_apply(half, _apply(half, 1 << i)) for i in range(32)]
                _SHIFTS.append(_tables(images))
    return _SHIFTS[k]


def combine_all(crc: int, crcs: Sequence[int], lengths: Sequence[int]) -> int:
    """``combine(...combine(combine(crc, crcs[0], lengths[0]), crcs[1], lengths[1])...)``
    in array passes. Shifting is linear, so the result is ``L_T(crc)`` XOR each
    ``L_R(crcs[i])``, T being every length and R the lengths after i: each shift is
    applied to every CRC at once, one table step per bit of the longest. An aggregate GET
    of 1,000 partials folded them one ``combine`` each: 3.5 ms before its first byte."""
    import numpy as np  # not at import: the client and the CLI load this module too

    n = np.asarray(lengths, np.int64)
    if not len(n):
        return crc
    c = np.where(n > 0, np.asarray(crcs, np.uint32), np.uint32(0))  # as combine: none
    n = np.maximum(n, 0)
    after = np.cumsum(n[::-1])[::-1] - n
    values = np.append(c, np.uint32(crc))
    shifts = np.append(after, n.sum())
    for k in range(int(shifts.max()).bit_length()):
        sel = np.flatnonzero((shifts >> k) & 1)
        if not len(sel):
            continue
        t = _array_tables(k)
        v = values[sel]
        values[sel] = t[0][v & 255] ^ t[1][(v >> 8) & 255] ^ t[2][(v >> 16) & 255] ^ t[3][v >> 24]
    return int(np.bitwise_xor.reduce(values))


_ARRAY_TABLES: list[Any] = []
_ARRAY_GROWING = threading.Lock()  # not _GROWING: _shift takes that one itself


def _array_tables(k: int) -> Any:
    """:func:`_shift` ``(k)`` as a (4, 256) uint32 array, built once per level; appended
    under a lock for the reason :func:`_shift` gives."""
    if len(_ARRAY_TABLES) <= k:
        import numpy as np

        with _ARRAY_GROWING:
            while len(_ARRAY_TABLES) <= k:
                _ARRAY_TABLES.append(np.array(_shift(len(_ARRAY_TABLES)), np.uint32))
    return _ARRAY_TABLES[k]


def combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of A||B from crc(A), crc(B) and len(B)."""
    if len2 <= 0:
        return crc1
    if len2 <= HW_SHIFT_MAX:
        # The CRC is affine in its start value: crc(A||B) = crc2 ^ (crc1 shifted over
        # len2 zero bytes), and the shift is crc(zeros, crc1) ^ crc(zeros, 0).
        zeros = _ZEROS[:len2]
        return _crc32c.crc32c(zeros, crc1) ^ _crc32c.crc32c(zeros, 0) ^ crc2
    _shift(len2.bit_length() - 1)
    c = crc1
    for t0, t1, t2, t3 in _SHIFTS:  # the loop of _apply inlined: it runs per partial served
        if len2 & 1:
            c = t0[c & 255] ^ t1[(c >> 8) & 255] ^ t2[(c >> 16) & 255] ^ t3[c >> 24]
        len2 >>= 1
        if not len2:
            break
    return c ^ crc2
