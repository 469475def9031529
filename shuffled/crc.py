"""CRC32C helpers: checksum of a buffer and combination of checksums without the data.

``combine`` lets the server give the aggregate stream a Content-Digest computed from the
stored per-file CRCs (zero-copy serving never reads the bytes into Python). The algorithm
is zlib's ``crc32_combine`` (multiplication by x^(8n) modulo the polynomial), ported for
the Castagnoli polynomial.
"""

from __future__ import annotations

import crc32c as _crc32c

_POLY = 0x82F63B78  # CRC32C, reflected


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (hardware accelerated)."""
    return _crc32c.crc32c(data, value)


def _multmodp(a: int, b: int) -> int:
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    table = [0] * 32
    p = 1 << 30  # x^1
    table[0] = p
    for n in range(1, 32):
        p = _multmodp(p, p)
        table[n] = p
    return table


_X2N = _x2n_table()


def _x2nmodp(n: int, k: int) -> int:
    p = 1 << 31  # x^0
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


#: Up to this length, shifting a CRC over len2 zero bytes with the hardware CRC is faster
#: than the ~40 us of Python polynomial arithmetic (an aggregate GET of 1,000 small partial
#: segments combines 1,000 CRCs before its first byte; found by bench/serve_small).
_HW_SHIFT_MAX = 256 << 10
_ZEROS = memoryview(bytes(_HW_SHIFT_MAX))


def combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of A||B from crc(A), crc(B) and len(B)."""
    if len2 <= 0:
        return crc1
    if len2 <= _HW_SHIFT_MAX:
        # The CRC is affine in its start value: crc(A||B) = crc2 ^ (crc1 shifted over
        # len2 zero bytes), and the shift is crc(zeros, crc1) ^ crc(zeros, 0).
        zeros = _ZEROS[:len2]
        return _crc32c.crc32c(zeros, crc1) ^ _crc32c.crc32c(zeros, 0) ^ crc2
    return _multmodp(_x2nmodp(len2, 3), crc1) ^ crc2
