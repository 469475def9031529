"""crc.combine equals the CRC32C of the concatenation on both of its paths."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from shuffled import crc
from shuffled.crc import combine, combine_all, crc32c


@pytest.mark.parametrize("len2", [1, 7, 8, 1000, 65_236, crc.HW_SHIFT_MAX - 1,
                                  crc.HW_SHIFT_MAX, crc.HW_SHIFT_MAX + 1, 3 << 20])
def test_combine_matches_concatenation(len2: int) -> None:
    a, b = os.urandom(37), os.urandom(len2)
    assert crc.combine(crc.crc32c(a), crc.crc32c(b), len2) == crc.crc32c(a + b)


def test_combine_of_empty_tail_is_head() -> None:
    assert crc.combine(0x1234, 0, 0) == 0x1234


@pytest.mark.parametrize("len2", [(1 << 29) + 4099, (1 << 31) + 12_345])
def test_combine_over_512_mib(len2: int) -> None:
    """Tails of 512 MiB and more (a partial may be up to 4 GiB): the zlib port used before
    wrapped its table of x^(2^k) after 32 steps, which holds only for an irreducible
    polynomial, and gave a wrong digest here. The truth is computed over real zeros."""
    head = os.urandom(37)
    zeros = bytes(16 << 20)
    tail_crc, left = 0, len2
    while left:
        step = min(left, len(zeros))
        tail_crc = crc.crc32c(memoryview(zeros)[:step], tail_crc)
        left -= step
    whole, left = crc.crc32c(head), len2
    while left:
        step = min(left, len(zeros))
        whole = crc.crc32c(memoryview(zeros)[:step], whole)
        left -= step
    assert crc.combine(crc.crc32c(head), tail_crc, len2) == whole


_THREADED = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
from shuffled import crc
a, b = os.urandom(37), os.urandom(3 << 20)
want = crc.crc32c(a + b)
sys.setswitchinterval(1e-6)  # threads switch inside a level's build, not only between
with ThreadPoolExecutor(8) as pool:
    got = list(pool.map(lambda _: crc.combine(crc.crc32c(a), crc.crc32c(b), len(b)),
                        range(32)))
print(sum(g == want for g in got))
"""


def test_tables_built_by_threads_at_once_stay_right() -> None:
    """The shift tables grow on first use from any thread (the event loop, the I/O
    threads): levels built twice at once must not shift the levels after them (a wrong
    digest). A fresh interpreter, so that the tables are built by the threads."""
    done = subprocess.run([sys.executable, "-c", _THREADED], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["32"]


@pytest.mark.parametrize("seed", range(6))
def test_combine_all_is_the_stream_of_its_parts(seed: int) -> None:
    """``combine_all`` folds many CRCs at once: the CRC of the concatenation itself
    (computed over the bytes, not from combine), with empty parts and lengths on both
    sides of the hardware path's 512 bytes among them."""
    rng = random.Random(seed)
    head = rng.randbytes(rng.randrange(0, 300))
    parts = [rng.randbytes(rng.choice([0, 1, 7, 511, 512, 513, 4096, rng.randrange(0, 70_000)]))
             for _ in range(rng.randrange(0, 60))]
    got = combine_all(crc32c(head), [crc32c(p) for p in parts], [len(p) for p in parts])
    assert got == crc32c(head + b"".join(parts))


def test_combine_all_ignores_an_empty_parts_crc_as_combine_does() -> None:
    assert combine_all(7, [0xDEADBEEF, 5], [0, 3]) == combine(combine(7, 0xDEADBEEF, 0), 5, 3)
    assert combine_all(7, [], []) == 7


_THREADED_ALL = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
from shuffled import crc
parts = [os.urandom(n) for n in (70_000, 3, 1 << 20, 513, 40_000)]
want = crc.crc32c(b"".join(parts))
crcs, lens = [crc.crc32c(p) for p in parts[1:]], [len(p) for p in parts[1:]]
sys.setswitchinterval(1e-6)  # threads switch inside a level's build, not only between
with ThreadPoolExecutor(8) as pool:
    got = list(pool.map(lambda _: crc.combine_all(crc.crc32c(parts[0]), crcs, lens),
                        range(32)))
print(sum(g == want for g in got))
"""


def test_array_tables_built_by_threads_at_once_stay_right() -> None:
    """``combine_all``'s array tables grow as the shift tables do, from any thread."""
    done = subprocess.run([sys.executable, "-c", _THREADED_ALL], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["32"]
