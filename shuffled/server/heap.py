"""The daemon's glibc heap: how it is set at start and given back after a large body
(best effort; glibc only).

A large upload is read 1 MiB per ``recv`` (:mod:`.streaming.bodies`), and those buffers,
freed, stay in the heap: :func:`tune_malloc` keeps up to 16 MiB free
at its top, and freed chunks below the top are not returned at all. The next requests then
start from a higher resident size (comparison 4's peak RSS rose 3-4 MiB, against a 150 MiB
target; in a fresh clone, 149 -> 153 MiB). ``malloc_trim(0)`` returns the free pages, top
and middle, once per large body. Measured (``bench.slab_profile``, alternated, three runs
each): peak RSS 102-106 vs 109-110 MiB, for 0.05-0.27 CPU s/GB more on 64 MiB slabs (the
pages fault in again on the next upload; noisy).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _libc(symbol: str) -> Any | None:
    """``symbol`` from the process's own symbols, libc's among them (None where libc is
    not glibc). Not ``find_library("c")``: it runs ldconfig in a subprocess (~3% of the
    daemon's start)."""
    try:
        return getattr(ctypes.CDLL(None), symbol)
    except (OSError, AttributeError):
        return None


# glibc mallopt parameters (malloc.h) and the values shuffled serve sets.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MALLOPTS = ((M_ARENA_MAX, 2), (M_MMAP_THRESHOLD, 4 << 20), (M_TRIM_THRESHOLD, 16 << 20))


def tune_malloc() -> bool:
    """Fix glibc's heap behaviour for a daemon that moves bodies (glibc only; best effort).

    By default glibc gives each I/O thread an arena of its own and raises its mmap
    threshold to the largest block freed (up to 32 MiB), so what the daemon kept grew with
    the load it had seen; two arenas and a fixed threshold keep it flat. The threshold is
    4 MiB, not glibc's initial 128 KiB, at which every 256 KiB socket read would be a fresh
    mapping (page faults, and daemon CPU per partial received, several times higher); up to
    16 MiB free at the heap's top is kept rather than trimmed and faulted in again. The
    figures are in docs/benchmarks.md ("Second session", the allocator).
    Called by ``shuffled serve`` before any thread starts, never by an embedded daemon
    (the process is its host's). Returns whether every setting was taken.
    """
    mallopt = _libc("mallopt")
    if mallopt is None:
        return False
    return all([bool(mallopt(param, value)) for param, value in MALLOPTS])


def trim() -> None:
    """Return the heap's free pages to the system (no-op where libc has no malloc_trim)."""
    malloc_trim = _libc("malloc_trim")
    if malloc_trim is not None:
        malloc_trim(0)
