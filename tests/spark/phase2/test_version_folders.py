"""Each ingestion's version folder is placed apart from the last one's (ext4's ``T``
attribute on ``<dataSource>/segments``, :func:`shuffled.spark.phase2.publish.spread_versions`).

Why it matters (docs/benchmarks.md, "Phase 2 waits on file creation on this machine"): on
ext4 without a journal, a new inode is not taken from those freed in the last minute, and
each create scans past them one by one. A rerun that replaced the previous version's 7,304
segments then paid 1.2-2.0 s per phase-2 worker in ``openat``. With ``segments/`` marked as
the top of a hierarchy, the Orlov allocator puts each version's folder, and so its files,
in a block group of its own.
"""

from __future__ import annotations

import array
import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from shuffled.spark.phase2.publish import FS_TOPDIR_FL, spread_versions

FS_IOC_GETFLAGS = 0x80086601


def _flags(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        got = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, got, True)
        return got[0]
    finally:
        os.close(fd)


def _fs_type(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_segments_is_marked_the_top_of_a_hierarchy_on_ext4(tmp_path: Path) -> None:
    if not _fs_type(tmp_path).startswith("ext"):
        pytest.skip(f"the test's folder is on {_fs_type(tmp_path)}, not ext2/3/4")
    root = tmp_path / "events" / "segments"
    root.mkdir(parents=True)
    assert spread_versions(str(root)) is True
    assert _flags(root) & FS_TOPDIR_FL
    assert spread_versions(str(root)) is True  # again: nothing changes, no error


def test_elsewhere_it_does_nothing_and_says_so(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or _fs_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    root = Path(os.path.join(shm, f"shuffled-test-{os.getpid()}", "segments"))
    root.mkdir(parents=True)
    try:
        assert spread_versions(str(root)) is False  # tmpfs has no such attribute
        assert spread_versions(str(root.parent / "missing")) is False
    finally:
        root.rmdir()
        root.parent.rmdir()
