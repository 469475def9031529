"""Atomic partial-segment writes: temp file -> CRC -> fsync -> validate -> rename.

Every method here blocks; the store calls them from an executor. Nothing is visible under
its final name until :func:`commit` renames it, and a failure anywhere leaves no file.
"""

from __future__ import annotations

import os
import time
import uuid
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


class TempPartial:
    """An upload being streamed into ``<location>/.tmp``."""

    def __init__(self, location: Location, expected_size: int | None, fsync: bool) -> None:
        self.location = location
        self.fsync = fsync
        self.size = 0
        self.crc = 0
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
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.size += len(data)

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
        facts = arrowfile.inspect(str(self.path), self.size)
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
