"""The daemon's glibc heap, given back after a large body (best effort; glibc only).

A large upload is read 1 MiB per ``recv`` (:mod:`.streaming.bodies`), and those buffers,
freed, stay in the heap: :func:`shuffled.server.runner.tune_malloc` keeps up to 16 MiB free
at its top, and freed chunks below the top are not returned at all. The next requests then
start from a higher resident size (comparison 4's peak RSS rose 3-4 MiB, against a 150 MiB
target; in a fresh clone, 149 -> 153 MiB). ``malloc_trim(0)`` returns the free pages, top
and middle, once per large body. Measured (``bench.slab_profile``, alternated, three runs
each): peak RSS 102-106 vs 109-110 MiB, for 0.05-0.27 CPU s/GB more on 64 MiB slabs (the
pages fault in again on the next upload; noisy).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def trim() -> None:
    """Return the heap's free pages to the system (no-op where libc has no malloc_trim)."""
    global _trim, _looked
    if not _looked:
        _looked = True
        try:
            _trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # not glibc
            _trim = None
    if _trim is not None:
        _trim(0)
