"""Where a slab lives: ``<location>/<sup>/<sub>.<slabId>.<attempt>.slab``, written as
``.<name>.<random>.tmp`` beside it, synced, then renamed (the commit) and the directory
synced. A start removes temporary leftovers."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import NamedTuple

from shuffled.storage.ondisk.layout import SLAB_SUFFIX as SUFFIX
from shuffled.storage.ondisk.layout import slab_file_name
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
TMP_SUFFIX = ".tmp"


class SlabName(NamedTuple):
    sub: str
    slab: int
    attempt: int

    @property
    def file_name(self) -> str:
        return slab_file_name(self.sub, self.slab, self.attempt)


def parse_name(name: str) -> SlabName | None:
    """``<sub>.<slab>.<attempt>.slab`` -> its parts; None if not a slab file's name."""
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    sub, _, rest = name[: -len(SUFFIX)].rpartition(".")
    sub, _, slab = sub.rpartition(".")
    if not sub or not slab.isdigit() or not rest.isdigit():
        return None
    return SlabName(sub, int(slab), int(rest))


def is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def path_of(root: Path, sup: str, name: SlabName) -> Path:
    return root / sup / name.file_name


def temporary(root: Path, sup: str, name: SlabName) -> Path:
    (root / sup).mkdir(exist_ok=True)
    return root / sup / f".{name.file_name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}"


def open_new(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                   0o644)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def writev_all(fd: int, chunks: list[bytes]) -> None:
    """``os.writev`` of every chunk, resumed after short writes, IOV_MAX at a time."""
    views = [memoryview(c) for c in chunks if len(c)]
    at = 0
    while at < len(views):
        batch = views[at: at + _IOV_MAX]
        n = os.writev(fd, batch)
        for view in batch:
            if n >= len(view):
                n -= len(view)
                at += 1
            else:
                views[at] = view[n:]
                break


def publish(fd: int, tmp: Path, final: Path, fsync: bool) -> None:
    """Sync the file, rename it to its name (the commit), sync the directory."""
    try:
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    if fsync:
        dfd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def discard(fd: int | None, tmp: Path) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
