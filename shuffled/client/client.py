"""The shuffled client API: upload, download (with resume and CRC32C checks), task admin, status.

Used by Spark executors (upload/download) and the driver (task admin, cleanup). A
:class:`ShuffleClient` holds one keep-alive connection and is not thread-safe: give each thread
(each Spark task) its own.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, BinaryIO, Protocol

from shuffled.client.digest import CHUNK, RunningCrc, check_crc, crc32c_of, crc_from_json
from shuffled.client.http import (
    NO_RETRY,
    BadResponse,
    RetryPolicy,
    ShuffleUnavailable,
    Transport,
    read_json,
)
from shuffled.errors import BadRequest, Conflict, DigestMismatch, NotFound, ShuffleError
from shuffled.protocol import (
    API_PREFIX,
    ARROW_STREAM,
    CONTENT_DIGEST,
    REPR_DIGEST,
    PartialKey,
    PartitionKey,
    format_crc32c,
    parse_crc32c,
    task_path,
    validate_id,
)

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


class _Sink(Protocol):
    def expect(self, total: int | None) -> None: ...

    def write(self, chunk: memoryview) -> None: ...

    def restart(self, what: str) -> None: ...


class _BytesSink:
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


class _LocalWriteError(Exception):
    """Writing to the caller's file failed: not a network problem, never retried."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(repr(cause))
        self.cause = cause


class _FileSink:
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
            raise _LocalWriteError(exc) from exc

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
            raise _LocalWriteError(exc) from exc


class _Download:
    """State of one download across tries: what arrived, its CRC, and what to resume from."""

    def __init__(self, what: str, sink: _Sink, resumable: bool) -> None:
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
        self._buf = bytearray(CHUNK)

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
        if isinstance(self.sink, _BytesSink) and self.total is not None:
            self._read_whole(resp, self.sink)
            return
        view = memoryview(self._buf)
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


    def _read_whole(self, resp: http.client.HTTPResponse, sink: _BytesSink) -> None:
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


def _json_dict(resp: http.client.HTTPResponse) -> dict[str, Any]:
    value = read_json(resp)
    if not isinstance(value, dict):
        raise BadResponse(f"expected a JSON object, got {type(value).__name__}")
    return value


class ShuffleClient:
    """Synchronous client of one shuffled daemon.

    Holds one keep-alive HTTP/1.1 connection (reopened after any connection error), so it is
    NOT thread-safe: use one client per thread. Every call retries per ``retry`` on connection
    errors, timeouts, 500/502/503/504 and 507 ``location_failed``; other 4xx answers raise the
    matching :mod:`shuffled.errors` error at once. Giving up on an unreachable server raises
    :class:`ShuffleUnavailable`.

    ``timeout`` bounds each socket operation (connect, each read), not a whole transfer.
    ``ca_file`` is a PEM bundle to trust for https (else the system store). ``token`` is sent
    as ``Authorization: Bearer <token>``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        self.base_url: str = base_url.strip().rstrip("/")
        self.retry = retry
        self._http = Transport(base_url, token=token, ca_file=ca_file, timeout=timeout, retry=retry)
        self._status_prefix: str | None = None

    # -- partial segments ---------------------------------------------------------------

    def put_partial(self, key: PartialKey, body: bytes | bytearray | memoryview) -> dict[str, Any]:
        """Store one partial segment (an Arrow IPC stream) under ``key``, replacing any earlier one.

        Sends ``Content-Digest: crc32c=...`` so the server rejects damaged bytes; a retry
        resends the whole body (PUT replaces atomically, so it is idempotent). Returns the
        server's JSON (``bytes``, ``rows``, ``crc32c``, ``generation``, ...). Raises
        DigestMismatch if the server reports a different CRC than the one sent.
        """
        view = memoryview(body).cast("B")
        crc = crc32c_of(view)
        what = str(key)
        result = self._http.request(
            "PUT",
            key.path(),
            query=key.query(),
            headers={"Content-Type": ARROW_STREAM, CONTENT_DIGEST: format_crc32c(crc)},
            body=view,
            handle=_json_dict,
            what=what,
        )
        stored = crc_from_json(result.get("crc32c"))
        check_crc(crc, stored, f"{what} (as stored by the server)")
        size = result.get("bytes")
        if isinstance(size, int) and not isinstance(size, bool) and size != view.nbytes:
            raise DigestMismatch(
                f"{what}: sent {view.nbytes} bytes, the server stored {size}", key=what
            )
        return result

    def get_partial(self, key: PartialKey) -> bytes:
        """The partial segment stored under ``key``, byte for byte, CRC32C-verified.

        A connection dropped mid-body is resumed with ``Range`` + ``If-Range`` (the ETag);
        if the stored bytes changed meanwhile the read starts over. Raises NotFound if
        nothing is stored, DigestMismatch (naming the key) if the bytes do not match the
        server's digest.
        """
        sink = _BytesSink()
        self._download(str(key), key.path(), list(key.query().items()), sink, resumable=True)
        return sink.value()

    def get_partial_to(self, key: PartialKey, out: BinaryIO) -> int:
        """Like :meth:`get_partial` but streamed into ``out`` in 1 MiB chunks; returns bytes written.

        Memory stays bounded whatever the size. If the read has to start over (the stored
        bytes changed), ``out`` is seeked back and truncated, which needs a seekable ``out``
        (else Conflict). On DigestMismatch ``out`` holds unverified bytes: discard them.
        """
        return self._download(
            str(key), key.path(), list(key.query().items()), _FileSink(out), resumable=True
        )

    def get_partition(
        self, partition: PartitionKey, sub_task_ids: Sequence[str] | None = None
    ) -> bytes:
        """Every partial segment of ``partition`` held by this daemon as ONE Arrow IPC stream.

        ``sub_task_ids`` restricts it to those subtasks (sent as repeated ``subTaskId=``);
        None means all. An empty sequence is refused (it would silently mean "all").
        Verifies ``Content-Digest`` when the server sends one; a dropped connection fetches
        the whole stream again.
        """
        sink = _BytesSink()
        query = self._partition_query(partition, sub_task_ids)
        self._download(_partition_label(partition), partition.path(), query, sink, resumable=False)
        return sink.value()

    def get_partition_to(
        self, partition: PartitionKey, out: BinaryIO, sub_task_ids: Sequence[str] | None = None
    ) -> int:
        """Like :meth:`get_partition`, streamed into ``out`` (seekable); returns bytes written."""
        query = self._partition_query(partition, sub_task_ids)
        return self._download(
            _partition_label(partition), partition.path(), query, _FileSink(out), resumable=False
        )

    @staticmethod
    def _partition_query(
        partition: PartitionKey, sub_task_ids: Sequence[str] | None
    ) -> list[tuple[str, str]]:
        query = list(partition.query().items())
        if sub_task_ids is not None:
            if isinstance(sub_task_ids, str):
                raise TypeError("sub_task_ids must be a sequence of ids, not one string")
            if len(sub_task_ids) == 0:
                raise BadRequest(
                    f"{_partition_label(partition)}: sub_task_ids is empty (pass None for all)",
                    field="subTaskId",
                )
            query += [("subTaskId", validate_id(s, "subTaskId")) for s in sub_task_ids]
        return query

    def _download(
        self, what: str, path: str, query: list[tuple[str, str]], sink: _Sink, *, resumable: bool
    ) -> int:
        state = _Download(what, sink, resumable)
        try:
            return self._http.request(
                "GET",
                path,
                query=query,
                headers=state.headers,
                handle=state.handle,
                what=what,
                progress=state.progress,
            )
        except _LocalWriteError as exc:
            raise exc.cause from None

    # -- tasks --------------------------------------------------------------------------

    def list_tasks(self) -> dict[str, Any]:
        """``GET /tasks``: the supervisor tasks held here with bytes, files, expiry."""
        value = self._http.request("GET", task_path(), handle=read_json, what="list tasks")
        if isinstance(value, list):
            return {"tasks": value}
        if not isinstance(value, dict):
            raise BadResponse(f"GET /tasks: expected a JSON object, got {type(value).__name__}")
        return value

    def task(self, supervisor_task_id: str) -> dict[str, Any] | None:
        """``GET /tasks/{id}``: that task's partitions and subtasks, or None if not held here."""
        what = f"task {supervisor_task_id}"

        def handle(resp: http.client.HTTPResponse) -> dict[str, Any] | None:
            if resp.status == 404:
                resp.read()
                return None
            return _json_dict(resp)

        return self._http.request(
            "GET", task_path(supervisor_task_id), handle=handle, what=what, accept=(404,)
        )

    def delete_task(self, supervisor_task_id: str) -> None:
        """``DELETE /tasks/{id}``: remove all of that task's data. Idempotent (unknown id is fine)."""

        def handle(resp: http.client.HTTPResponse) -> None:
            resp.read()

        self._http.request(
            "DELETE",
            task_path(supervisor_task_id),
            handle=handle,
            what=f"delete task {supervisor_task_id}",
            accept=(404,),
        )

    # -- status -------------------------------------------------------------------------

    def health(self) -> bool:
        """True if the daemon answers ``GET /status/health`` with ``true``; one try, never raises
        for an unreachable or unhealthy server."""
        try:
            value = self._status_get("/status/health", read_json, NO_RETRY)
        except (ShuffleError, OSError, http.client.HTTPException):
            return False
        return value is True

    def status(self) -> dict[str, Any]:
        """``GET /status``: version, uptime, locations."""
        value: dict[str, Any] = self._status_get("/status", _json_dict, None)
        return value

    def _status_get(
        self, suffix: str, handle: Callable[[http.client.HTTPResponse], Any],
        policy: RetryPolicy | None,
    ) -> Any:
        """GET a status route under the API prefix, falling back to the root (Druid's
        ``/status/health``) if the prefixed one is 404; the route that worked is remembered."""
        prefixes = [self._status_prefix] if self._status_prefix is not None else [API_PREFIX, ""]
        for i, prefix in enumerate(prefixes):
            try:
                value = self._http.request(
                    "GET", prefix + suffix, handle=handle, what=suffix.lstrip("/"), policy=policy
                )
            except NotFound:
                if i + 1 < len(prefixes):
                    continue
                raise
            self._status_prefix = prefix
            return value
        raise AssertionError("unreachable")

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (a later call reopens one)."""
        self._http.close()

    def __enter__(self) -> ShuffleClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShuffleClient({self.base_url!r})"


def _partition_label(partition: PartitionKey) -> str:
    return f"{partition.supervisor_task_id} {partition.interval} partition {partition.partition_id}"


__all__ = ["RetryPolicy", "ShuffleClient", "ShuffleUnavailable", "crc32c_of"]
