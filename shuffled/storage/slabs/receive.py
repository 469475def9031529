"""One slab upload: its sections read (bounded), its data streamed to a temporary file with
writes off the event loop (the next chunk arrives while the last is written), the whole
checked and made durable off the event loop, then committed by rename and one catalog row.

Nothing per batch happens on the event loop: the loop moves chunks; the writer thread
writes and checksums them; the check reads the batches' metadata together, in numpy, on an
I/O thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shuffled.crc import crc32c
from shuffled.errors import Conflict, DigestMismatch, InvalidBody
from shuffled.slab import wire
from shuffled.storage.ondisk import writeback
from shuffled.storage.slabs import check, files

WRITE_AT_LEAST = 4 << 20  # bytes gathered before one write (a thread hop each)


class Pull:
    """Exact byte counts from an async iterator of chunks."""

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        self.body = body
        self.left = b""

    async def exactly(self, n: int, what: str) -> bytes:
        parts = [self.left] if self.left else []
        have = len(self.left)
        while have < n:
            try:
                chunk = await anext(self.body)
            except StopAsyncIteration:
                raise InvalidBody(f"a slab ended inside its {what}: {have} of {n} bytes") from None
            parts.append(chunk)
            have += len(chunk)
        joined = b"".join(parts)
        self.left = joined[n:]
        return joined[:n]

    async def rest(self) -> AsyncIterator[bytes]:
        if self.left:
            yield self.left
            self.left = b""
        async for chunk in self.body:
            yield chunk


@dataclass
class Received:
    """A slab whose bytes are in a temporary file, checked, not yet committed."""

    prefix: wire.Prefix
    header: wire.SlabHeader
    index: pa.Table
    head: bytes  # the prefix, header, index and statistics as they came
    tmp: Path
    fd: int | None
    size: int


async def sections(pull: Pull, *, content_length: int, max_index: int, max_stats: int,
                   max_data: int) -> tuple[wire.Prefix, wire.SlabHeader, bytes, bytes, bytes]:
    """Read and check the prefix, header, index and statistics; the data follows."""
    raw = await pull.exactly(wire.PREFIX_LEN, "prefix")
    prefix = wire.parse_prefix(raw, max_index=max_index, max_stats=max_stats, max_data=max_data)
    if prefix.total != content_length:
        raise InvalidBody(f"a slab of {prefix.total} bytes by its prefix arrived with "
                          f"Content-Length {content_length}")
    head = await pull.exactly(prefix.header_len, "header")
    header = wire.parse_header(prefix, head)
    index = await pull.exactly(prefix.index_len, "index")
    stats = await pull.exactly(prefix.stats_len, "statistics")
    if crc32c(index) != header.crc_index or crc32c(stats) != header.crc_stats:
        raise DigestMismatch("a slab's index or statistics section fails its CRC32C")
    return prefix, header, raw + head, index, stats


def check_sections(prefix: wire.Prefix, header: wire.SlabHeader, index_raw: bytes,
                   stats_raw: bytes) -> pa.Table:
    """The index, checked against the header (and the statistics' shape); blocking."""
    index = check.small_section(index_raw, wire.INDEX_SCHEMA, "index")
    wire.check_index(index, header, prefix)
    check.key_bounds(index, prefix.kind)
    if stats_raw:
        check.small_section(stats_raw, wire.STATS_SCHEMA, "statistics")
    return index


def write(fd: int, data: bytes, crc: int) -> int:
    files.write_all(fd, data)
    return crc32c(data, crc)


def write_chunks(fd: int, chunks: list[bytes], crc: int) -> int:
    """Write ``chunks`` with ``writev`` (no joined copy in the heap), and start their
    write-back (the sync at the commit then waits for the last few MiB only, not for the
    whole slab: the bulk path of partials did this and took 64 MiB faster); their CRC32C."""
    files.writev_all(fd, chunks)
    if writeback.START is not None:
        writeback.START(fd, 0, 0)
    for chunk in chunks:
        crc = crc32c(chunk, crc)
    return crc


async def stream_data(pull: Pull, fd: int, run: Callable[..., Awaitable[int]],
                      data_len: int) -> int:
    """Stream the data section to ``fd`` (after what was written); its CRC32C. Chunks are
    gathered to :data:`WRITE_AT_LEAST` and written by one ``writev`` on an I/O thread while
    the next ones arrive."""
    crc = 0
    pending: asyncio.Future[int] | None = None
    buf: list[bytes] = []
    have = got = 0
    async for chunk in pull.rest():
        got += len(chunk)
        if got > data_len:
            raise InvalidBody(f"a slab's body is longer than its prefix says ({data_len} "
                              "bytes of data)")
        buf.append(chunk)
        have += len(chunk)
        if have >= WRITE_AT_LEAST:
            if pending is not None:
                crc = await pending
            pending = asyncio.ensure_future(run(write_chunks, fd, buf, crc))
            buf, have = [], 0
    if pending is not None:
        crc = await pending
    if buf:
        crc = await run(write_chunks, fd, buf, crc)
    if got != data_len:
        raise InvalidBody(f"a slab ended inside its data section: {got} of {data_len} bytes")
    return crc


class FileSection:
    """A slab's data section in the file ``fd`` from ``data_at``: read with ``pread``,
    mapped read-only a window at a time (:func:`.check.data_section`)."""

    def __init__(self, fd: int, data_at: int, size: int) -> None:
        self.fd, self.data_at, self.size = fd, data_at, size

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, self.data_at + offset)

    @contextlib.contextmanager
    def mapped(self, offset: int, length: int) -> Iterator[npt.NDArray[np.uint8]]:
        start = self.data_at + offset
        aligned = start - start % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(self.fd, start + length - aligned, access=mmap.ACCESS_READ,
                            offset=aligned)
        try:
            yield np.frombuffer(mapping, np.uint8)[start - aligned:]
        finally:
            try:
                mapping.close()
            except BufferError:
                pass  # an InvalidBody's traceback still views it: unmapped when it goes


def check_data(fd: int, data_at: int, data_len: int, kind: wire.KeyKind,
               index: pa.Table) -> pa.Schema:
    """Check the data section as written: its messages' metadata read back (from the page
    cache) through read-only mappings, a window at a time; blocking."""
    if data_len <= 0:
        raise InvalidBody("a slab has an empty data section")
    return check.data_section(FileSection(fd, data_at, data_len), kind, index)


def open_tmp(root: Path, sup: str, name: files.SlabName) -> tuple[Path, int]:
    tmp = files.temporary(root, sup, name)
    return tmp, files.open_new(tmp)


def held_elsewhere(existing_crc: int, crc: int, name: files.SlabName, sup: str) -> None:
    if existing_crc != crc:
        raise Conflict(f"slab {name.slab} (attempt {name.attempt}) of subtask {name.sub} of "
                       f"{sup} is held with other bytes: a slab never changes; send it under "
                       "a new attempt", supervisorTaskId=sup, subTaskId=name.sub)
