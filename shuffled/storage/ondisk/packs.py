"""Pack files: partial segments of one supervisor task appended back to back.

Why per (location, supervisor task) and not per partition as Celeborn does: a Druid-shaped
job has thousands of partitions (time chunks x shards) of a few small partials each, so a
file per partition would be nearly a file per partial again; a task's packs are few, and
deleting the task is removing its directory. A pack is written by one upload at a time
(taken from the pool, given back after), so concurrent uploads of one task append to
different packs and never interleave; at most :data:`MAX_IDLE` idle packs per task and
location stay open for the next upload. Before each use, :func:`ready` checks the file
system (read-only, free space beyond the reserve) in the same I/O-thread call that writes:
an open descriptor would otherwise keep writing to a file system remounted read-only.
"""

from __future__ import annotations

import errno
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuffled.errors import InsufficientStorage
from shuffled.storage.ondisk import layout
from shuffled.storage.location import Location

MAX_IDLE = 4
IOV_MAX = 1024  # buffers one pwritev may take (Linux UIO_MAXIOV)


class Pack:
    """An open pack file and the length written so far (the next partial's offset)."""

    __slots__ = ("location", "sup", "number", "path", "fd", "size", "dead", "fresh", "schemas",
                 "writeback", "busy")

    def __init__(self, location: int, sup: str, number: int, path: Path, fd: int) -> None:
        self.location = location
        self.sup = sup
        self.number = number
        self.path = path
        self.fd: int | None = fd
        self.size = 0
        self.dead = False  # its task was deleted, or a write failed half-way: never reuse
        self.fresh = True  # nothing of it was ever committed
        # (CRC32C, length) of each schema message written here -> its offset: partials of
        # the same schema refer to one copy (one writer at a time: no race).
        self.schemas: dict[tuple[int, int], int] = {}
        self.writeback = 0  # write-back of dirty pages started up to here
        # An append is under way (set and read on the event loop): a commit record must
        # not be written into the middle of it (storage.commit.committer).
        self.busy = False

    def __repr__(self) -> str:
        return f"Pack({self.path}, {self.size} bytes)"

    # -- blocking --------------------------------------------------------------------------

    def write(self, views: list[memoryview]) -> int:
        """Append ``views`` at the end with as few ``pwritev`` calls as it takes."""
        assert self.fd is not None
        total = sum(len(v) for v in views)
        at = self.size
        views = [v for v in views if len(v)]
        while views:
            written = os.pwritev(self.fd, views[:IOV_MAX], at)
            at += written
            done = 0  # drop the views written whole, trim the one written in part
            while done < len(views) and written >= len(views[done]):
                written -= len(views[done])
                done += 1
            views = views[done:]
            if views and written:
                views[0] = views[0][written:]
        self.size += total
        return total

    def cut(self, size: int) -> None:
        """Drop everything past ``size`` (an upload refused half-way leaves nothing)."""
        assert self.fd is not None
        os.ftruncate(self.fd, size)
        self.size = size
        self.schemas = {k: at for k, at in self.schemas.items() if at < size}

    def sync(self) -> None:
        if self.fd is not None:
            os.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


    def remove_if_fresh(self) -> None:
        """Unlink a pack nothing was ever committed to, and its task directory if empty,
        so a refused first upload of a task leaves no trace."""
        if not self.fresh:
            return
        try:
            os.unlink(self.path)
            os.rmdir(self.path.parent)
        except OSError:
            pass  # gone already, or the directory holds other packs: fine


def create(root: Path, location: int, sup: str, number: int, fsync: bool) -> Pack:
    """Create a new empty pack (blocking). Its name is durable before anything refers to it."""
    directory = layout.task_dir(root, sup)
    made = False
    try:
        directory.mkdir()
        made = True
    except FileExistsError:
        pass
    path = layout.pack_path(root, sup, number)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    if fsync:
        try:
            layout.fsync_dir(directory)
            if made:
                layout.fsync_dir(root)
        except BaseException:
            os.close(fd)
            raise
    return Pack(location, sup, number, path, fd)


class Unusable(Exception):
    """The location cannot take the write (full, read-only, failing): try another one."""

    def __init__(self, cause: OSError | InsufficientStorage) -> None:
        super().__init__(str(cause))
        self.cause = cause


class WriteFailed(Exception):
    """Writing to ``pack`` failed with ``cause``; the pack must not be used again."""

    def __init__(self, pack: Pack, cause: OSError) -> None:
        super().__init__(str(cause))
        self.pack = pack
        self.cause = cause


def ready(loc: Location, sup: str, pack: Pack | None, number: int, fsync: bool,
          size: int) -> Pack:
    """Check that ``loc`` can take ``size`` more bytes, and give a pack there: ``pack``, or
    a new one numbered ``number``. Raises :class:`Unusable` otherwise (blocking)."""
    try:
        st = os.statvfs(loc.path)
        if st.f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, "Read-only file system")
        free = st.f_bavail * st.f_frsize
        # reserved_bytes: this write's size and every other placement under way at this
        # location (read on another thread: a snapshot is enough), so that concurrent
        # uploads cannot each see the same free space and together run into ENOSPC.
        if size and free - max(size, loc.reserved_bytes) < loc.reserve_bytes:
            raise InsufficientStorage(
                f"location {loc.path} would drop below its free-space reserve "
                f"({loc.reserve_bytes} bytes)", location=str(loc.path))
        return pack if pack is not None else create(loc.path, loc.index, sup, number, fsync)
    except (OSError, InsufficientStorage) as exc:
        raise Unusable(exc) from exc


def on_pack(loc: Location, sup: str, pack: Pack | None, number: int, fsync: bool, size: int,
            job: Callable[..., Any] | None, *args: Any) -> tuple[Pack, Any]:
    """:func:`ready`, then ``job(pack, *args)`` in the same I/O-thread call (one hop for a
    small upload instead of one per step)."""
    pack = ready(loc, sup, pack, number, fsync, size)
    if job is None:
        return pack, None
    try:
        return pack, job(pack, *args)
    except OSError as exc:
        pack.dead = True
        raise WriteFailed(pack, exc) from exc


class PackPool:
    """Idle packs by (location index, supervisor task); event-loop only."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._idle: dict[tuple[int, str], list[Pack]] = defaultdict(list)

    def take(self, location: int, sup: str) -> Pack | None:
        idle = self._idle.get((location, sup))
        if not idle:
            return None
        pack = idle.pop()
        if not idle:
            del self._idle[(location, sup)]
        return pack

    def give(self, pack: Pack) -> Pack | None:
        """Keep ``pack`` for the next upload; returns it if it must be closed instead."""
        if pack.dead or pack.fd is None or pack.size >= self.max_size:
            return pack
        idle = self._idle[(pack.location, pack.sup)]
        if len(idle) >= MAX_IDLE:
            return pack
        idle.append(pack)
        return None

    def drop_task(self, sup: str) -> list[Pack]:
        """Take every idle pack of ``sup`` out (to be closed): its task is being deleted."""
        out = []
        for key in [k for k in self._idle if k[1] == sup]:
            out.extend(self._idle.pop(key))
        for pack in out:
            pack.dead = True
        return out

    def drop_location(self, location: int) -> list[Pack]:
        out = []
        for key in [k for k in self._idle if k[0] == location]:
            out.extend(self._idle.pop(key))
        for pack in out:
            pack.dead = True
        return out

    def all(self) -> list[Pack]:
        return [p for idle in self._idle.values() for p in idle]
