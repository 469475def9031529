"""Downloads that verify CRC32C while reading and resume a dropped body with Range + If-Range."""

from __future__ import annotations

import http.client
import re
from collections.abc import Sequence
from typing import BinaryIO, Protocol

from shuffled.client.answers import BadResponse
from shuffled.client.digest import CHUNK, RunningCrc, check_crc
from shuffled.client.http import Request, Transport
from shuffled.errors import BadRequest, Conflict, DigestMismatch
from shuffled.protocol import (CONTENT_DIGEST, REPR_DIGEST, PartitionKey, parse_crc32c,
                               validate_id)

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


class Sink(Protocol):
    def expect(self, total: int | None) -> None: ...

    def write(self, chunk: memoryview) -> None: ...

    def restart(self, what: str) -> None: ...


class BytesSink:
    """Collects the body in memory (get_partial / get_partition) as a list of bytes chunks.

    A body of known length arrives as one ``bytes`` read straight from the socket (see
    ``_Download._read_body``), so the common case allocates the result once and never copies
    it; fresh memory is the dominant cost for large bodies.
    """

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def expect(self, total: int | None) -> None:
        pass

    def take(self, data: bytes) -> None:
        self._chunks.append(data)

    def write(self, chunk: memoryview) -> None:
        self._chunks.append(chunk.tobytes())

    def restart(self, what: str) -> None:
        self._chunks = []

    def value(self) -> bytes:
        if len(self._chunks) == 1:
            return self._chunks[0]
        return b"".join(self._chunks)


class DiscardSink:
    """Verifies and throws the body away (finding which partial segment is corrupt)."""

    def expect(self, total: int | None) -> None:
        pass

    def write(self, chunk: memoryview) -> None:
        pass

    def restart(self, what: str) -> None:
        pass


class LocalWriteError(Exception):
    """Writing to the caller's file failed: not a network problem, never retried."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(repr(cause))
        self.cause = cause


class FileSink:
    """Streams the body into a caller's binary file object (get_partial_to)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.start: int | None = None
        try:
            if out.seekable():
                self.start = out.tell()
        except (OSError, ValueError):
            self.start = None

    def expect(self, total: int | None) -> None:
        pass

    def write(self, chunk: memoryview) -> None:
        try:
            while chunk.nbytes:
                n = self.out.write(chunk)
                if n is None or n >= chunk.nbytes:
                    return
                chunk = chunk[n:]
        except OSError as exc:
            raise LocalWriteError(exc) from exc

    def restart(self, what: str) -> None:
        if self.start is None:
            raise Conflict(
                f"{what}: the stored bytes changed while being read and the output is not "
                "seekable, so the read cannot start over",
                key=what,
            )
        try:
            self.out.seek(self.start)
            self.out.truncate()
        except OSError as exc:
            raise LocalWriteError(exc) from exc


class Download:
    """State of one download across tries: what arrived, its CRC, and what to resume from."""

    def __init__(self, what: str, sink: Sink, resumable: bool) -> None:
        self.what = what
        self.sink = sink
        self.resumable = resumable
        self.received = 0
        self.total: int | None = None
        self.etag: str | None = None
        self.expected: int | None = None
        self.crc = RunningCrc()
        # Furthest offset ever reached: the retry loop's progress signal. A try that only
        # re-reads bytes already seen (a restart) is not progress, so retries stay bounded.
        self.high_water = 0

    def progress(self) -> int:
        return self.high_water

    def _can_resume(self) -> bool:
        # If-Range needs a strong validator; without one a resumed read could splice two files.
        return (
            self.resumable
            and self.received > 0
            and self.etag is not None
            and not self.etag.startswith("W/")
        )

    def headers(self) -> dict[str, str]:
        if self._can_resume():
            assert self.etag is not None
            return {"Range": f"bytes={self.received}-", "If-Range": self.etag}
        return {}

    def _reset(self) -> None:
        if self.received:
            self.sink.restart(self.what)
        self.received = 0
        self.total = None
        self.etag = None
        self.expected = None
        self.crc.reset()

    def _start_over(self, reason: str) -> None:
        """Forget what arrived and make the retry loop fetch the whole body again."""
        self._reset()
        raise http.client.HTTPException(f"{self.what}: {reason}; fetching it again from byte 0")

    def handle(self, resp: http.client.HTTPResponse) -> int:
        if resp.status == 416:
            resp.read()
            self._start_over("range not satisfiable")
        if resp.status == 206 and self.received > 0:
            self._begin_partial(resp)
        elif resp.status in (200, 203):
            self._reset()
            self._begin_full(resp)
        else:
            raise BadResponse(f"{self.what}: unexpected HTTP {resp.status} {resp.reason}")
        self._read_body(resp)
        check_crc(self.crc.value, self.expected, self.what)
        return self.received

    def _begin_full(self, resp: http.client.HTTPResponse) -> None:
        length = resp.getheader("Content-Length")
        self.total = int(length) if length and length.isdigit() else None
        self.etag = resp.getheader("ETag")
        self.expected = _digest(resp, CONTENT_DIGEST, self.what)
        if self.expected is None:
            self.expected = _digest(resp, REPR_DIGEST, self.what)
        self.sink.expect(self.total)

    def _begin_partial(self, resp: http.client.HTTPResponse) -> None:
        match = _CONTENT_RANGE.match(resp.getheader("Content-Range") or "")
        etag = resp.getheader("ETag")
        if match is None or int(match.group(1)) != self.received:
            self._start_over(f"bad Content-Range {resp.getheader('Content-Range')!r} for a resume at {self.received}")
        assert match is not None
        if etag is not None and etag != self.etag:
            self._start_over("the ETag changed")
        repr_crc = _digest(resp, REPR_DIGEST, self.what)
        if repr_crc is not None and self.expected is not None and repr_crc != self.expected:
            self._start_over("the representation digest changed")
        if self.expected is None:
            self.expected = repr_crc
        if match.group(3) != "*":
            self.total = int(match.group(3))

    def _read_body(self, resp: http.client.HTTPResponse) -> None:
        if isinstance(self.sink, BytesSink) and self.total is not None:
            self._read_whole(resp, self.sink)
            return
        view = memoryview(bytearray(CHUNK))
        while True:
            want = CHUNK if self.total is None else min(CHUNK, self.total - self.received)
            if want <= 0:
                break
            n = resp.readinto(view[:want])
            if not n:
                break
            chunk = view[:n]
            self.crc.update(chunk)
            self.sink.write(chunk)
            self.received += n
            if self.received > self.high_water:
                self.high_water = self.received
        if self.total is not None and self.received < self.total:
            raise http.client.IncompleteRead(b"", self.total - self.received)
        if not resp.isclosed():
            # Declared length reached; anything more would be a protocol error.
            if resp.read(1):
                raise BadResponse(f"{self.what}: the server sent more than Content-Length")


    def _read_whole(self, resp: http.client.HTTPResponse, sink: BytesSink) -> None:
        """Read the rest of a known-length body into one bytes object, hashing it in 1 MiB
        slices; a short read (dropped connection) keeps what arrived for the resume."""
        assert self.total is not None
        want = self.total - self.received
        data = resp.read(want) if want > 0 else b""
        view = memoryview(data)
        for i in range(0, len(data), CHUNK):
            self.crc.update(view[i : i + CHUNK])
        if data:
            sink.take(data)
        self.received += len(data)
        self.high_water = max(self.high_water, self.received)
        if self.received < self.total:
            raise http.client.IncompleteRead(b"", self.total - self.received)
        if not resp.isclosed() and resp.read(1):
            raise BadResponse(f"{self.what}: the server sent more than Content-Length")


def _digest(resp: http.client.HTTPResponse, header: str, what: str) -> int | None:
    try:
        return parse_crc32c(resp.getheader(header))
    except DigestMismatch as exc:
        raise BadResponse(f"{what}: the server sent a malformed {header}: {exc.message}") from exc


def fetch(http_: Transport, what: str, path: str, query: list[tuple[str, str]], sink: Sink, *,
          resumable: bool) -> int:
    """``GET path?query`` into ``sink`` through a :class:`Download` (checked, resumed if
    ``resumable``); returns the bytes written. A failing sink raises its own error."""
    state = Download(what, sink, resumable)
    try:
        return http_.request(Request("GET", path, query=query, headers=state.headers,
                                     handle=state.handle, what=what, progress=state.progress))
    except LocalWriteError as exc:
        raise exc.cause from None


def partition_label(partition: PartitionKey) -> str:
    return f"{partition.supervisor_task_id} {partition.interval} partition {partition.partition_id}"


def partition_query(partition: PartitionKey, sub_task_ids: Sequence[str] | None,
                    ) -> list[tuple[str, str]]:
    """The query naming ``partition`` and its subtasks (repeated ``subTaskId=``; None: all).
    An empty sequence is refused: it would silently mean "all"."""
    query = list(partition.query().items())
    if sub_task_ids is not None:
        if isinstance(sub_task_ids, str):
            raise TypeError("sub_task_ids must be a sequence of ids, not one string")
        if len(sub_task_ids) == 0:
            raise BadRequest(
                f"{partition_label(partition)}: sub_task_ids is empty (pass None for all)",
                field="subTaskId",
            )
        query += [("subTaskId", validate_id(s, "subTaskId")) for s in sub_task_ids]
    return query
