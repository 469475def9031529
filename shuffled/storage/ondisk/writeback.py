"""Starting the write-back of a file's dirty pages without waiting for it, so that the
fsync that makes the file durable finds little left to do (a pack's appends, a slab's
body): Linux ``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``, which Python does
not bind. :data:`START` is None where it is unavailable."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _starter() -> Callable[[int, int, int], object] | None:
    """Linux ``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)`` (no Python binding):
    start writing dirty pages back without waiting, so the commit's fdatasync finds little
    left to do. None where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return lambda fd, offset, count: fn(fd, offset, count, 2)  # SYNC_FILE_RANGE_WRITE



#: ``START(fd, offset, count)`` (count 0: to the end of the file), or None.
START = _starter()
