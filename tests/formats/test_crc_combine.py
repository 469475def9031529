"""crc.combine equals the CRC32C of the concatenation on both of its paths."""

from __future__ import annotations

import os

import pytest

from shuffled import crc


@pytest.mark.parametrize("len2", [1, 7, 8, 1000, 65_236, crc._HW_SHIFT_MAX - 1,
                                  crc._HW_SHIFT_MAX, crc._HW_SHIFT_MAX + 1, 3 << 20])
def test_combine_matches_concatenation(len2: int) -> None:
    a, b = os.urandom(37), os.urandom(len2)
    assert crc.combine(crc.crc32c(a), crc.crc32c(b), len2) == crc.crc32c(a + b)


def test_combine_of_empty_tail_is_head() -> None:
    assert crc.combine(0x1234, 0, 0) == 0x1234
