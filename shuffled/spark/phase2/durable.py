"""Making written files durable in batches (phase 2's segments, the publisher's moves).

One fsync per small file is what made phase 2 pay ~1 ms per segment on top of writing it.
Files written by one task are instead synced together once the task has written them all:
one ``syncfs(2)`` of their file system (Linux; it reports writeback errors since 5.8), or
an fsync per file where ``syncfs`` is missing. Either way nothing is published before it
returns, as before.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _syncfs = _libc.syncfs
except (OSError, AttributeError):
    _libc = None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(path: str) -> bool:
    """``syncfs(2)`` the file system holding ``path``; False where it is not available.
    Raises OSError on a writeback error."""
    if _libc is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)
    return True


def sync_files(paths: Iterable[str], directories: Iterable[str]) -> None:
    """Make ``paths`` (files) and ``directories`` (their entries) durable: one syncfs of
    the first directory's file system when the kernel has it (all of them must be on that
    file system), else an fsync of each."""
    dirs = list(dict.fromkeys(directories))
    if dirs and syncfs(dirs[0]):
        return
    for path in paths:
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
    for d in dirs:
        fsync_dir(d)
