"""Atomic partial-segment writes: temp file -> CRC -> fsync -> validate -> rename.

Every method here blocks; the store calls them from an executor. Nothing is visible under
its final name until :func:`commit` renames it, and a failure anywhere leaves no file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch, InsufficientStorage
from shuffled.protocol import PartialKey, crc_hex
from shuffled.storage import arrowfile, layout
from shuffled.storage.index import PartialMeta
from shuffled.storage.location import Location


@dataclass(slots=True)
class Written:
    """A finished, validated temp file waiting for commit."""

    tmp: Path
    size: int
    crc: int
    facts: arrowfile.ArrowFacts


def _writeback_starter() -> Callable[[int, int, int], object] | None:
    """Linux ``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)`` (no Python binding):
    start writing dirty pages back without waiting, so the fsync at the end finds little
    left to do instead of the whole file. None where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return lambda fd, offset, count: fn(fd, offset, count, 2)  # SYNC_FILE_RANGE_WRITE


_START_WRITEBACK = _writeback_starter()
WRITEBACK_STEP = 8 << 20  # bytes written between two writeback starts


class TempPartial:
    """An upload being streamed into ``<location>/.tmp``."""

    def __init__(self, location: Location, expected_size: int | None, fsync: bool) -> None:
        self.location = location
        self.fsync = fsync
        self.size = 0
        self.crc = 0
        self._synced = 0  # writeback started up to here (see WRITEBACK_STEP)
        # CRC32C of the stream between its schema message and its end-of-stream marker,
        # folded in as the bytes arrive so validation need not read the file again.
        self._head = bytearray()  # the first 8 bytes: continuation marker + schema length
        self._schema_len: int | None = None  # -1: not a stream start (inspect rejects it)
        self._body_crc = 0
        self._hold = b""  # the last bytes seen (up to 8): maybe the end-of-stream marker
        self.path = location.tmp_dir / f"{uuid.uuid4().hex}.part"
        if expected_size:
            _, free = location.disk_usage()
            if free - expected_size < location.reserve_bytes:
                raise InsufficientStorage(
                    f"location {location.path} would drop below its free-space reserve "
                    f"({location.reserve_bytes} bytes)", location=str(location.path),
                )
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` (all of it) and fold it into the running CRC."""
        assert self._fd is not None
        view = memoryview(data)
        self.crc = crc32c(view, self.crc)
        self._fold_body(view)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.size += len(data)
        if self.fsync and _START_WRITEBACK and self.size - self._synced >= WRITEBACK_STEP:
            _START_WRITEBACK(self._fd, self._synced, self.size - self._synced)
            self._synced = self.size

    def _fold_body(self, view: memoryview) -> None:
        """Fold the part of ``view`` (at offset ``self.size``) past the schema message into
        the body CRC, holding back the last 8 bytes (the end-of-stream marker)."""
        if self._schema_len is None:
            self._head += view[: max(0, 8 - len(self._head))]
            if len(self._head) < 8:
                return
            meta_len = int.from_bytes(self._head[4:8], "little", signed=True)
            ok = bytes(self._head[:4]) == arrowfile.CONTINUATION and meta_len > 0
            self._schema_len = 8 + meta_len if ok else -1
        if self._schema_len < 0:
            return
        body = view[max(0, self._schema_len - self.size):]
        if not body:
            return
        eos = len(arrowfile.EOS)
        if len(body) >= eos:
            self._body_crc = crc32c(body[:-eos], crc32c(self._hold, self._body_crc))
            self._hold = bytes(body[-eos:])
        else:
            joined = self._hold + bytes(body)
            self._body_crc = crc32c(joined[:-eos], self._body_crc)
            self._hold = joined[-eos:]

    def finish(self, expected_crc: int | None) -> Written:
        """Check the digest, fsync, close and validate the Arrow stream."""
        assert self._fd is not None
        if expected_crc is not None and expected_crc != self.crc:
            raise DigestMismatch(
                f"body CRC32C is {crc_hex(self.crc)} but Content-Digest says "
                f"{crc_hex(expected_crc)}: the upload was corrupted in transit; retry it",
                received=crc_hex(self.crc), expected=crc_hex(expected_crc),
            )
        if self.fsync:
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        body_crc = self._body_crc if self._schema_len and self._schema_len > 0 else None
        facts = arrowfile.inspect(str(self.path), self.size, body_crc)
        return Written(self.path, self.size, self.crc, facts)

    def discard(self) -> None:
        """Close and remove the temp file; safe to call more than once."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def commit(written: Written, location: Location, key: PartialKey, generation: int,
           fsync: bool) -> PartialMeta:
    """Give ``written`` its final name. The sidecar lands first, the data file last, so a
    data file on disk always has its metadata (recovery drops a sidecar without data)."""
    final = layout.data_path(location.path, key, generation)
    final.parent.mkdir(parents=True, exist_ok=True)
    facts = written.facts
    meta = PartialMeta(
        key=key, generation=generation, location=location.index, path=final,
        size=written.size, rows=facts.rows, crc=written.crc, schema_len=facts.schema_len,
        schema_crc=facts.schema_crc, body_crc=facts.body_crc,
        has_dictionaries=facts.has_dictionaries, created=time.time(),
    )
    layout.write_json_atomic(layout.meta_path(final), meta.to_json(), fsync)
    os.replace(written.tmp, final)
    if fsync:
        layout.fsync_dir(final.parent)
    return meta


def remove(meta: PartialMeta) -> None:
    """Unlink a partial segment's data then its sidecar; missing files are fine."""
    for path in (meta.path, layout.meta_path(meta.path)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
