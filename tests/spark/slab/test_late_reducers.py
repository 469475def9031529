"""The late plan's reduce (statistics merged and planned per chunk) spreads the chunks over
its reducers.

Found 2026-11-28: ``partitionBy(reducers)`` used PySpark's ``portable_hash`` of the key
``("c", chunk_start)``. That hash is the tuple's elements XORed in and multiplied by an
odd number, so its low bits are the start's low bits, and a day chunk's start in
milliseconds is a multiple of 1,024 (86,400,000 = 2^10 x 84,375). With 2, 4, 8 ... 1,024
reducers every chunk went to ONE of them: on the bench's Druid shape one Python worker
merged and planned all 3,652 chunks while the other waited.
"""

from __future__ import annotations

import collections

import pytest

from shuffled.spark.driver import late

DAY = 86_400_000
T0 = 1_262_304_000_000  # 2010-01-01


@pytest.mark.parametrize("reducers", [2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("step", [DAY, 3_600_000, 7 * DAY, 1000])
def test_chunks_spread_over_reducers(reducers: int, step: int) -> None:
    keys = [("c", T0 + i * step) for i in range(3652)]
    counts = collections.Counter(late.reducer_of(k) % reducers for k in keys)
    share = len(keys) / reducers
    assert len(counts) == reducers, counts
    assert max(counts.values()) < 1.25 * share, counts


def test_task_lines_spread_and_keys_are_ints() -> None:
    got = collections.Counter(late.reducer_of(("t", i)) % 4 for i in range(64))
    assert len(got) == 4 and max(got.values()) <= 24
    assert all(0 <= late.reducer_of(("c", T0 + i * DAY)) < 1 << 32 for i in range(100))
