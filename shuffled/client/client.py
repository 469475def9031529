"""The shuffled client API: upload, download (with resume and CRC32C checks), task admin, status.

Used by Spark executors (upload/download) and the driver (task admin, cleanup). A
:class:`ShuffleClient` holds one keep-alive connection and is not thread-safe: give each thread
(each Spark task) its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

from shuffled.client import pages, partitions, slabs, supervisor, tasks
from shuffled.client.answers import json_dict
from shuffled.client.bulk import upload_all
from shuffled.client.digest import check_crc, crc32c_of, crc_from_json
from shuffled.client.download import (
    BytesSink,
    DiscardSink,
    FileSink,
    Sink,
    fetch,
    partition_label,
    partition_query,
)
from shuffled.client.http import Request, Transport
from shuffled.client.retry import RetryPolicy, ShuffleUnavailable
from shuffled.client.status import StatusRoutes
from shuffled.errors import DigestMismatch, ShuffleError
from shuffled.protocol import (
    ARROW_STREAM,
    CONTENT_DIGEST,
    Interval,
    PartialKey,
    PartitionKey,
    format_crc32c,
    task_path,
    validate_id,
)

if TYPE_CHECKING:
    from shuffled.slab.build import Slab


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
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``clock`` and ``sleep`` time the retries (:class:`.http.Transport`)."""
        self.base_url: str = base_url.strip().rstrip("/")
        self.retry = retry
        self._http = Transport(base_url, token=token, ca_file=ca_file, timeout=timeout,
                               retry=retry, clock=clock, sleep=sleep)
        self._status = StatusRoutes(self._http, self.base_url, token_sent=token is not None)

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
        result = self._http.request(Request(
            "PUT",
            key.path(),
            query=key.query(),
            headers={"Content-Type": ARROW_STREAM, CONTENT_DIGEST: format_crc32c(crc)},
            body=view,
            handle=json_dict,
            what=what,
        ))
        stored = crc_from_json(result.get("crc32c"))
        check_crc(crc, stored, f"{what} (as stored by the server)")
        size = result.get("bytes")
        if isinstance(size, int) and not isinstance(size, bool) and size != view.nbytes:
            raise DigestMismatch(
                f"{what}: sent {view.nbytes} bytes, the server stored {size}", key=what
            )
        return result

    def put_partials(
        self, supervisor_task_id: str,
        partials: Iterable[tuple[PartialKey, bytes | bytearray | memoryview]],
    ) -> list[dict[str, Any]]:
        """Store many partial segments of one supervisor task with ONE streamed request
        (``POST /tasks/{sup}/partials``, docs/bulk-upload.md) per
        :data:`~shuffled.client.bulk.BULK_PARTIALS` of them (2,000, under the daemon's
        ``max_bulk_partials``); returns the server's answer per partial, in input order
        (``status`` created/replaced, ``crc32c``, ``bytes``...).

        ``partials`` is consumed lazily: each frame goes on the wire as soon as it is
        produced, while the caller makes the next one (a list or tuple is sent in ~1 MiB
        chunks instead). An empty iterable sends nothing. Every key must belong to
        ``supervisor_task_id`` (ValueError when one is reached; the frames before it are
        stored, the batch is not complete). Every body carries its CRC32C and each stored
        one is checked against what the server reports (DigestMismatch otherwise). A cut
        connection or a retryable answer resends the whole batch (the bodies are kept;
        replacing a key is idempotent); partials the server rejected for a passing reason
        (``location_failed``, ``overloaded``, 5xx) are sent again in a new batch, per the
        retry policy; any other rejection raises its domain error. An older daemon
        without the route (404/405) gets one PUT per partial instead.
        """
        sup = validate_id(supervisor_task_id, "supervisorTaskId")
        return upload_all(self._http, f"{task_path(sup)}/partials", sup, partials,
                          self.put_partial)

    def put_flush(self, supervisor_task_id: str, schema: bytes,
                  bodies: Iterable[tuple[PartialKey, bytes | bytearray | memoryview]],
                  ) -> list[dict[str, Any]]:
        """:meth:`put_partials` of partials given as one Arrow IPC schema message and the
        bodies of streams of that schema (their dictionary and record batch messages, e.g.
        byte ranges of one stream a flush was written as): each partial is the stream
        ``schema + body + end-of-stream marker``, which the answers' ``bytes`` and
        ``crc32c`` describe and every read gives back. Sent in bulk format 2 without
        re-assembling them (docs/bulk-upload.md)."""
        sup = validate_id(supervisor_task_id, "supervisorTaskId")
        return upload_all(self._http, f"{task_path(sup)}/partials", sup, bodies,
                          self.put_partial, schema=schema)

    def get_partial(self, key: PartialKey) -> bytes:
        """The partial segment stored under ``key``, byte for byte, CRC32C-verified.

        A connection dropped mid-body is resumed with ``Range`` + ``If-Range`` (the ETag);
        if the stored bytes changed meanwhile the read starts over. Raises NotFound if
        nothing is stored, DigestMismatch (naming the key) if the bytes do not match the
        server's digest.
        """
        sink = BytesSink()
        self._download(str(key), key.path(), list(key.query().items()), sink, resumable=True)
        return sink.value()

    def get_partial_to(self, key: PartialKey, out: BinaryIO) -> int:
        """Like :meth:`get_partial` but streamed into ``out`` in 1 MiB chunks; returns bytes written.

        Memory stays bounded whatever the size. If the read has to start over (the stored
        bytes changed), ``out`` is seeked back and truncated, which needs a seekable ``out``
        (else Conflict). On DigestMismatch ``out`` holds unverified bytes: discard them.
        """
        return self._download(
            str(key), key.path(), list(key.query().items()), FileSink(out), resumable=True
        )

    def get_partition(
        self, partition: PartitionKey, sub_task_ids: Sequence[str] | None = None
    ) -> bytes:
        """Every partial segment of ``partition`` held by this daemon as ONE Arrow IPC stream.

        ``sub_task_ids`` restricts it to those subtasks (sent as repeated ``subTaskId=``);
        None means all. An empty sequence is refused (it would silently mean "all").
        Verifies ``Content-Digest`` when the server sends one; a dropped connection fetches
        the whole stream again. On a digest mismatch each partial segment is fetched alone
        (each has its own stored CRC) and the DigestMismatch names the corrupt one (``key``);
        a server that finds a stored file corrupt answers CorruptData naming it.
        """
        sink = BytesSink()
        query = partition_query(partition, sub_task_ids)
        self._download_partition(partition, sub_task_ids, query, sink)
        return sink.value()

    def get_partitions(
        self, supervisor_task_id: str,
        wanted: Sequence[tuple[PartitionKey, Sequence[str] | None]],
    ) -> list[bytes]:
        """Many partitions of one supervisor task, each as what :meth:`get_partition`
        returns, in order, read with few requests (``POST /tasks/{sup}/partitions``, up to
        :data:`~shuffled.client.partitions.MAX_PER_REQUEST` partitions each).

        ``wanted`` pairs each partition with its subtask ids (None for all). Every frame is
        checked against its CRC32C; a cut answer is asked for again. A partition the daemon
        serves only re-encoded (schemas differ), a batch failing a CRC32C check, and every
        partition of an older daemon without the route are read with :meth:`get_partition`
        (which names a corrupt partial). Raises NotFound as :meth:`get_partition` would.
        """
        sup = validate_id(supervisor_task_id, "supervisorTaskId")
        for key, subs in wanted:
            if key.supervisor_task_id != sup:
                raise ValueError(f"{key} does not belong to supervisor task {sup}")
            partition_query(key, subs)  # the same refusals as get_partition
        out: list[bytes] = []
        for at in range(0, len(wanted), partitions.MAX_PER_REQUEST):
            chunk = wanted[at: at + partitions.MAX_PER_REQUEST]
            try:
                answers = partitions.read(self._http, f"{task_path(sup)}/partitions", sup, chunk)
            except DigestMismatch:
                answers = None  # read each alone: get_partition finds the corrupt partial
            for i, (key, subs) in enumerate(chunk):
                body = answers[i][1] if answers is not None else None
                out.append(body if body is not None else self.get_partition(key, subs))
        return out

    def get_partition_to(
        self, partition: PartitionKey, out: BinaryIO, sub_task_ids: Sequence[str] | None = None
    ) -> int:
        """Like :meth:`get_partition`, streamed into ``out`` (seekable); returns bytes written."""
        query = partition_query(partition, sub_task_ids)
        return self._download_partition(partition, sub_task_ids, query, FileSink(out))

    def _download_partition(
        self, partition: PartitionKey, sub_task_ids: Sequence[str] | None,
        query: list[tuple[str, str]], sink: Sink,
    ) -> int:
        what = partition_label(partition)
        try:
            return self._download(what, partition.path(), query, sink, resumable=False)
        except DigestMismatch as exc:
            culprit = self._find_corrupt(partition, sub_task_ids)
            if culprit is None:
                raise  # every partial verifies alone: the damage was in transit
            raise DigestMismatch(
                f"{what}: the aggregate stream failed its CRC32C check because partial "
                f"segment {culprit.details.get('key')} is corrupt ({culprit.message})",
                key=culprit.details.get("key"), partition=what,
            ) from exc

    def _find_corrupt(
        self, partition: PartitionKey, sub_task_ids: Sequence[str] | None
    ) -> DigestMismatch | None:
        """After an aggregate digest mismatch, fetch each partial of ``partition`` alone
        (each carries its own stored CRC) and return the first one's mismatch, if any."""
        if sub_task_ids is None:
            held = self.task(partition.supervisor_task_id) or {}
            sub_task_ids = [
                str(sub.get("subTaskId"))
                for part in held.get("partitions", [])
                if part.get("partitionId") == partition.partition_id
                and part.get("start") == partition.interval.start_iso
                and part.get("end") == partition.interval.end_iso
                for sub in part.get("subTasks", [])
            ]
        for sub in sub_task_ids:
            key = PartialKey(partition.supervisor_task_id, sub, partition.interval,
                             partition.partition_id)
            try:
                self._download(str(key), key.path(), list(key.query().items()), DiscardSink(),
                               resumable=True)
            except DigestMismatch as exc:
                return exc
            except ShuffleError:
                continue  # gone or unreachable meanwhile: only diagnosing, keep looking
        return None

    def _download(
        self, what: str, path: str, query: list[tuple[str, str]], sink: Sink, *, resumable: bool
    ) -> int:
        return fetch(self._http, what, path, query, sink, resumable=resumable)

    def read_page(self, partition: PartitionKey, token: int = 0, *, max_bytes: int = 8 << 20,
                  max_wait: float = 0.0, sub_task_ids: Sequence[str] | None = None,
                  ) -> pages.Page:
        """One page of a paged partition read (see :mod:`shuffled.client.pages`)."""
        subs = None if sub_task_ids is None else [validate_id(s, "subTaskId")
                                                  for s in sub_task_ids]
        return pages.read_page(self._http, partition, token, max_bytes=max_bytes,
                               max_wait=max_wait, subs=subs)

    def pages(self, partition: PartitionKey, *, max_bytes: int = 8 << 20,
              sub_task_ids: Sequence[str] | None = None, poll: float = 10.0,
              deadline: float = 600.0) -> Iterator[bytes]:
        """Every page of ``partition`` (each an Arrow IPC stream of at most about
        ``max_bytes``, or one record batch if that is bigger) until it is complete: the
        task sealed and every sealed partial passed. Long-polls while it is up to date but
        not complete; raises TaskFailed for a failed task and NotComplete after
        ``deadline`` seconds without progress."""
        subs = None if sub_task_ids is None else [validate_id(s, "subTaskId")
                                                  for s in sub_task_ids]
        return pages.iter_pages(self._http, partition, max_bytes=max_bytes, subs=subs,
                                poll=poll, deadline=deadline)

    # -- tasks --------------------------------------------------------------------------

    # -- slabs (shuffled.client.slabs, docs/slab.md) ---------------------------------------

    def put_slab(self, supervisor_task_id: str, slab: Slab) -> dict[str, Any]:
        """:func:`.slabs.put_slab`."""
        return slabs.put_slab(self._http, supervisor_task_id, slab)

    def read_shard(self, supervisor_task_id: str, interval: Interval,
                   key_from: bytes | None, key_to: bytes | None) -> slabs.SlabRead:
        """:func:`.slabs.read_shard`."""
        return slabs.read_shard(self._http, supervisor_task_id, interval, key_from, key_to)

    def read_shards(self, supervisor_task_id: str,
                    shards: Sequence[tuple[Interval, bytes | None, bytes | None]],
                    without: Collection[str] = (), *, keys: bool = False,
                    ) -> list[slabs.SlabRead]:
        """:func:`.slabs.read_shards`."""
        return slabs.read_shards(self._http, supervisor_task_id, shards, without, keys=keys)

    # -- the supervisor's calls (shuffled.client.supervisor) ------------------------------

    def seal(self, supervisor_task_id: str, sub_task_ids: Sequence[str]) -> dict[str, Any]:
        """:func:`.supervisor.seal`."""
        return supervisor.seal(self._http, supervisor_task_id, sub_task_ids)

    def heartbeat(self, supervisor_task_id: str, *,
                  quota: dict[str, int] | None = None) -> dict[str, Any]:
        """:func:`.supervisor.heartbeat`."""
        return supervisor.heartbeat(self._http, supervisor_task_id, quota=quota)

    def fail(self, supervisor_task_id: str) -> None:
        """:func:`.supervisor.fail`."""
        supervisor.fail(self._http, supervisor_task_id)

    def warm(self, supervisor_task_id: str) -> dict[str, Any]:
        """:func:`.supervisor.warm` (a client whose base URL is ``<daemon>/peers/<instance>``)."""
        return supervisor.warm(self._http, supervisor_task_id)

    def task_state(self, supervisor_task_id: str, *, known: str | None = None,
                   max_wait: float = 0.0) -> dict[str, Any]:
        """:func:`.supervisor.task_state`."""
        return supervisor.task_state(self._http, supervisor_task_id, known=known,
                                     max_wait=max_wait)

    def declare_lost(self, supervisor_task_id: str, servers: Sequence[str]) -> dict[str, Any]:
        """:func:`.supervisor.declare_lost`."""
        return supervisor.declare_lost(self._http, supervisor_task_id, servers)

    def lost_daemons(self, supervisor_task_id: str) -> list[str]:
        """:func:`.supervisor.lost_daemons`."""
        return supervisor.lost_daemons(self._http, supervisor_task_id)

    # -- tasks (listing) ------------------------------------------------------------------

    def list_tasks(self) -> dict[str, Any]:
        """``GET /tasks``: the supervisor tasks held here with bytes, files, expiry."""
        return tasks.list_tasks(self._http)

    def task(self, supervisor_task_id: str, *, page_size: int = 5000) -> dict[str, Any] | None:
        """``GET /tasks/{id}``: that task's partitions and subtasks, or None if not held here.

        Pages through the listing (``limit``/``cursor``, ``page_size`` partials a request)
        and returns it whole: a partition cut by a page's end is joined again. Use
        :meth:`task_pages` to walk a very large task without holding all of it.
        """
        return tasks.joined(self.task_pages(supervisor_task_id, page_size=page_size))

    def task_pages(self, supervisor_task_id: str, *, page_size: int = 5000,
                   ) -> Iterator[dict[str, Any]]:
        """``GET /tasks/{id}?limit=..&cursor=..`` page after page (nothing if not held)."""
        return tasks.task_pages(self._http, supervisor_task_id, page_size=page_size)

    def delete_task(self, supervisor_task_id: str) -> dict[str, Any]:
        """:func:`.tasks.delete_task`: remove all of that task's data (idempotent); what
        was removed."""
        return tasks.delete_task(self._http, supervisor_task_id)

    # -- status -------------------------------------------------------------------------

    def health(self) -> bool:
        """True if the daemon answers ``GET /status/health`` with ``true``; one try, False for
        an unreachable or unhealthy server. Raises :class:`Unauthorized` (naming the server
        and whether a token was sent) when it refuses the token: a live daemon, not a dead
        one, and the remedy is the token, not the URL."""
        return self._status.health()

    def status(self) -> dict[str, Any]:
        """``GET /status``: version, uptime, locations."""
        return self._status.status()

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


__all__ = ["RetryPolicy", "ShuffleClient", "ShuffleUnavailable", "crc32c_of"]
