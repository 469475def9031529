"""One storage location: its directory, exclusive lock, size accounting and health."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

from shuffled.errors import ConfigError, LocationLocked

LOCK_NAME = ".lock"
TMP_DIR = ".tmp"
# A location taken out of service for want of space returns only with this much free
# beyond its reserve, so it does not flap in and out on the last few pages.
PROBE_MIN_FREE = 1 << 20


class Location:
    """A directory holding partial segments, owned exclusively by one daemon.

    ``used_bytes`` counts committed files; ``reserved_bytes`` counts uploads in flight, so
    concurrent writers cannot together overshoot ``max_bytes``.
    """

    def __init__(self, index: int, path: Path, max_bytes: int | None, reserve_bytes: int) -> None:
        self.index = index
        self.path = path
        self.max_bytes = max_bytes
        self.reserve_bytes = reserve_bytes
        self.used_bytes = 0
        self.reserved_bytes = 0
        self.files = 0
        self.healthy = True
        self.full = False  # out of service for want of space (not a failing disk)
        self.probed_at = 0.0  # when a placement last probed it (monotonic)
        # Signs the commit records of its packs (storage.ondisk.commits); read at start.
        self.commit_key = b""
        self.last_error: str | None = None
        self._lock_fd: int | None = None

    def __repr__(self) -> str:
        return f"Location({self.path})"

    @property
    def tmp_dir(self) -> Path:
        return self.path / TMP_DIR

    # -- lifecycle (blocking: call from an executor) --------------------------------------

    def open(self) -> None:
        """Create the directory, take the exclusive lock, clear leftover temp files."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if self.path.exists() and not self.path.is_dir():
                what = f"{self.path} is a file, not a directory; give --location a directory"
            else:
                what = (f"cannot use {self.path}: {exc.strerror}; give --location a directory "
                        f"this user can create and write")
            raise ConfigError(f"locations: {what} (it is created if missing)",
                              setting="locations") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LocationLocked(
                    f"location {self.path} is locked by another shuffled process; give each "
                    f"daemon its own locations", setting="locations", location=str(self.path)
                ) from exc
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir.mkdir(exist_ok=True)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- accounting (event loop) --------------------------------------------------------

    def has_room(self, size: int) -> bool:
        """Healthy, and ``size`` more bytes stay within ``max_bytes``."""
        if not self.healthy:
            return False
        if self.max_bytes is None:
            return True
        return self.used_bytes + self.reserved_bytes + size <= self.max_bytes

    def mark_unhealthy(self, reason: str, *, full: bool = False) -> None:
        self.healthy = False
        self.full = full
        self.last_error = reason

    def mark_healthy(self) -> None:
        self.healthy = True
        self.full = False
        self.last_error = None

    # -- disk facts (blocking) ----------------------------------------------------------

    def disk_usage(self) -> tuple[int, int]:
        """(total, free) bytes of the file system holding the location."""
        usage = shutil.disk_usage(self.path)
        return usage.total, usage.free

    def probe(self) -> None:
        """Write, fsync and remove a small file, and check the file system has free space
        beyond the reserve; raises OSError (ENOSPC for too little space) if not."""
        _, free = self.disk_usage()
        if free < self.reserve_bytes + PROBE_MIN_FREE:
            raise OSError(errno.ENOSPC, f"only {free} bytes free (reserve "
                                        f"{self.reserve_bytes} + {PROBE_MIN_FREE})")
        probe = self.tmp_dir / ".probe"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
