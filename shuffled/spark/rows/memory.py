"""A merge task's peak memory, from Linux's own accounting (``/proc/self``).

Spark reuses a Python worker for many tasks, so the process's lifetime peak says little
about one task: the peak is reset when a task starts (writing ``5`` to ``clear_refs``,
Linux >= 4.0) and read as ``VmHWM`` as the task goes. Elsewhere both are no-ops (0).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re

import pyarrow as pa

_HWM = re.compile(rb"VmHWM:\s+(\d+) kB")
_RSS = re.compile(rb"VmRSS:\s+(\d+) kB")


def release_free_memory() -> None:
    """Hand memory freed by earlier tasks back to the system (Arrow's pool, then glibc's
    heap), so that what this task adds shows in RSS instead of reusing retained pages."""
    pa.default_memory_pool().release_unused()
    name = ctypes.util.find_library("c")
    if name:
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def reset_peak_rss() -> None:
    """Start counting this process's peak resident set size from now (best effort)."""
    try:
        with open("/proc/self/clear_refs", "wb") as fh:
            fh.write(b"5")
    except OSError:
        pass


def _status(pattern: re.Pattern[bytes]) -> int:
    try:
        with open("/proc/self/status", "rb") as fh:
            m = pattern.search(fh.read())
    except OSError:
        return 0
    return int(m.group(1)) * 1024 if m else 0


def peak_rss() -> int:
    """Peak resident set size in bytes since the last reset (0 where unknown)."""
    return _status(_HWM)


def rss() -> int:
    """Resident set size in bytes now (0 where unknown)."""
    return _status(_RSS)
