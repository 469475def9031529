"""Bulk upload from the client side: frames streamed as the caller produces partials.

The caller's iterable is consumed lazily, so a phase-1 task encodes the next partial
while the previous ones are on the wire. What was sent is kept (references, no copies) so
that a retry resends the whole batch: replacing a key is idempotent on the daemon.

Frames are bulk format 2 (:mod:`shuffled.framing2`): each schema message once, each
partial as its body. A whole stream is split on the way (its schema message compared with
the last one sent); a caller holding a flush as one schema and bodies (phase 1) gives them
so. A daemon older than format 2 refuses the first frame naming the version it reads: the
batch is sent again in format 1 (whole streams), and this client keeps to format 1.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from dataclasses import dataclass

from shuffled import framing, framing2
from shuffled.client.answers import BadResponse, domain_error
from shuffled.client.chunked import FLUSH
from shuffled.client.digest import crc32c_of
from shuffled.client.http import Request, Transport
from shuffled.client.retry import is_retryable
from shuffled.crc import combine
from shuffled.errors import BadRequest, DigestMismatch, ShuffleError
from shuffled.protocol import PartialKey, PartialStatus, crc_hex

log = logging.getLogger("shuffled.client")

Body = bytes | bytearray | memoryview
PutOne = Callable[[PartialKey, memoryview], dict[str, Any]]
_CONT = b"\xff\xff\xff\xff"
EOS = _CONT + b"\x00\x00\x00\x00"
EOS_CRC = crc32c_of(EOS)
WHOLE = framing2.WHOLE  # a PARTIAL frame's schema id when its body is a whole stream


@dataclass(slots=True, kw_only=True)
class Sent:
    """One partial of a batch: its stream's CRC32C and length (what the answer and every read
    give), and how it travels: ``body`` after schema ``schema`` (``WHOLE``: the body is the
    whole stream, sent as it is)."""

    key: PartialKey
    body: memoryview
    crc: int
    size: int
    body_crc: int
    schema: int

    @property
    def item(self) -> tuple[PartialKey, memoryview]:
        return self.key, self.body


def _split(view: memoryview) -> tuple[bytes, memoryview] | None:
    """A whole stream's (schema message, body), or None if it does not look like one (it is
    then sent whole, and the daemon refuses it for what it is)."""
    if len(view) < 16 or bytes(view[:4]) != _CONT or bytes(view[-8:]) != EOS:
        return None
    head = 8 + int.from_bytes(view[4:8], "little", signed=True)
    if head <= 8 or head > len(view) - 8:
        return None
    return bytes(view[:head]), view[head:-8]


class Batch:
    """A replayable stream of frames over ``partials``: call it for each try.

    ``partials`` are whole Arrow IPC streams, or, with ``schema`` (one schema message),
    the bodies of streams of that schema (a phase-1 flush). The source is pulled one
    partial at a time, only when its frame is about to be sent; before pulling from a lazy
    source (not a list or tuple) the frames already made are flushed onto the wire, so they
    travel while the caller produces the next one. ``version`` is the bulk format sent.
    """

    def __init__(self, supervisor_task_id: str, partials: Iterable[tuple[PartialKey, Body]],
                 schema: bytes | None = None, version: int = 2) -> None:
        self.sup = supervisor_task_id
        self._lazy = not isinstance(partials, (list, tuple))
        self._source = iter(partials)
        self.sent: list[Sent] = []
        self.exhausted = False
        self.version = version
        self.schemas: list[bytes] = []  # schema id -> message
        self._fixed = None if schema is None else self._schema_id(schema)
        self._fixed_crc = 0 if schema is None else crc32c_of(schema)

    def _schema_id(self, head: bytes) -> int:
        if not self.schemas or self.schemas[-1] != head:
            self.schemas.append(head)
        return len(self.schemas) - 1

    def _pull(self) -> bool:
        """Take the next partial from the source into :attr:`sent`; False at its end."""
        if self.exhausted:
            return False
        try:
            key, body = next(self._source)
        except StopIteration:
            self.exhausted = True
            return False
        if key.supervisor_task_id != self.sup:
            raise ValueError(f"{key} does not belong to supervisor task {self.sup}")
        view = memoryview(body).cast("B")
        if self._fixed is not None:
            body_crc = crc32c_of(view)
            schema_len = len(self.schemas[self._fixed])
            crc = combine(combine(self._fixed_crc, body_crc, len(view)), EOS_CRC, len(EOS))
            self.sent.append(Sent(key=key, body=view, crc=crc,
                                  size=schema_len + len(view) + len(EOS), body_crc=body_crc,
                                  schema=self._fixed))
            return True
        crc = crc32c_of(view)
        parts = _split(view)
        if parts is None:
            self.sent.append(Sent(key=key, body=view, crc=crc, size=len(view), body_crc=crc,
                                  schema=WHOLE))
        else:
            head, rest = parts
            self.sent.append(Sent(key=key, body=rest, crc=crc, size=len(view),
                                  body_crc=crc32c_of(rest), schema=self._schema_id(head)))
        return True

    def subset(self, indexes: Sequence[int]) -> Batch:
        """A batch of some of the partials already pulled (sent again on their own)."""
        out = Batch(self.sup, [], version=self.version)
        out.sent = [self.sent[i] for i in indexes]
        out.schemas = self.schemas
        out.exhausted = True
        return out

    def whole(self, part: Sent) -> memoryview:
        """The partial's whole stream (format 1, or a PUT of it alone)."""
        if part.schema == WHOLE:
            return part.body
        return memoryview(b"".join([self.schemas[part.schema], part.body, EOS]))

    def empty(self) -> bool:
        """True if the source yields nothing (pulls its first partial to know)."""
        return not self.sent and not self._pull()

    def __call__(self) -> Iterator[bytes | memoryview]:
        count = 0
        schemas_sent = 0
        while count < len(self.sent) or self._pull():
            part = self.sent[count]
            if self.version == 1:
                view = self.whole(part)
                yield framing.encode(part.key, view.nbytes, part.crc)
                yield view
            else:
                while part.schema != WHOLE and schemas_sent <= part.schema:
                    head = self.schemas[schemas_sent]
                    yield framing2.encode_schema(schemas_sent, len(head))
                    yield head
                    schemas_sent += 1
                yield framing2.encode_partial(part.key, part.schema, part.body.nbytes,
                                              part.body_crc)
                yield part.body
            count += 1
            if self._lazy and count == len(self.sent) and not self.exhausted:
                yield FLUSH  # the caller may take a while to produce the next one
        yield framing.encode_end(count) if self.version == 1 else framing2.encode_end(count)

    def all(self) -> list[Sent]:
        """Every partial of the batch (the rest of the source consumed if need be)."""
        while self._pull():
            pass
        return self.sent


def check_stored(sent: Sent, item: dict[str, Any]) -> None:
    """The daemon's answer for a stored partial matches what was sent."""
    key, crc = sent.key, sent.crc
    if item.get("crc32c") != crc_hex(crc):
        raise DigestMismatch(f"{key}: sent CRC32C {crc_hex(crc)}, the server stored "
                             f"{item.get('crc32c')}", key=str(key))
    size = item.get("bytes")
    if size != sent.size:
        raise DigestMismatch(f"{key}: sent {sent.size} bytes, the server stored {size}",
                             key=str(key))


def matches(key: PartialKey, item: dict[str, Any]) -> bool:
    """The answer ``item`` names ``key``."""
    return (item.get("subTaskId") == key.sub_task_id
            and item.get("start") == key.interval.start_iso
            and item.get("end") == key.interval.end_iso
            and item.get("partitionId") == key.partition_id)


def rejection(item: dict[str, Any], what: str) -> tuple[ShuffleError, bool]:
    """The domain error of a rejected item and whether sending it again may succeed
    (the same rule as for a whole request: 5xx, or 507 ``location_failed``)."""
    error = item.get("error")
    error = dict(error) if isinstance(error, dict) else {"error": f"rejected: {item}"}
    status = error.pop("status", 500)
    status = status if isinstance(status, int) and 400 <= status < 600 else 500
    exc = domain_error(status, error, what)
    return exc, is_retryable(status, exc)


def _answer(resp: http.client.HTTPResponse) -> dict[str, Any] | None:
    raw = resp.read()
    if resp.status in (404, 405):
        return None  # a daemon without the route
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("partials"), list):
        raise BadResponse(f"bulk upload answer is not a batch result: {raw[:100]!r}")
    return value


#: Partials one bulk upload carries at most; more go as several uploads, in order. The
#: daemon holds each partial of an upload (~1.5 KB resident) until it answers: filling a
#: million tiny partials by uploads of 10,000 from 3 threads peaked at 192 MiB, by uploads
#: of 2,000 at 115 (and no slower). Under the daemon's ``max_bulk_partials`` (10,000 by
#: default), so a daemon of an older default takes them too.
BULK_PARTIALS = 2_000


def upload_all(transport: Transport, path: str, sup: str,
               partials: Iterable[tuple[PartialKey, Body]], put_one: PutOne,
               schema: bytes | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """:func:`upload` of ``partials`` in batches of at most ``limit`` (default
    :data:`BULK_PARTIALS`), one request each, in order; the answers of them all. A list or
    tuple is cut into lists; any other iterable stays lazy."""
    limit = limit or BULK_PARTIALS
    chunks: Iterator[Iterable[tuple[PartialKey, Body]]]
    if isinstance(partials, (list, tuple)):
        chunks = (partials[at: at + limit] for at in range(0, len(partials), limit))
    else:
        source = iter(partials)
        chunks = (itertools.islice(source, limit) for _ in itertools.count())
    out: list[dict[str, Any]] = []
    for chunk in chunks:
        batch = Batch(sup, chunk, schema=schema)
        if batch.empty():
            break
        out.extend(upload(transport, path, batch, put_one))
    return out


def upload(transport: Transport, path: str, batch: Batch, put_one: PutOne) -> list[dict[str, Any]]:
    """Send ``batch`` (not empty) to ``path``; the stored item per partial, in order.

    The transport resends the whole stream on a cut or a retryable answer; partials the
    daemon rejected for a passing reason go again in a new batch (up to the policy's
    attempts); any other rejection raises its error. 404/405: one ``put_one`` each.
    """
    what = f"bulk upload to {batch.sup}"
    policy = transport.retry
    answers: dict[int, dict[str, Any]] = {}
    todo: Sequence[int] | None = None  # indexes into batch.sent still to store; None: all
    batch.version = min(batch.version, transport.bulk_version)
    for attempt in range(1, policy.attempts + 1):
        source = batch if todo is None else batch.subset(todo)
        req = Request("POST", path, headers={"Content-Type": framing.MEDIA_TYPE},
                      stream=source, handle=_answer, what=what, accept=(404, 405))
        try:
            result = transport.request(req)
        except BadRequest as exc:
            if not (batch.version == 2 and "bulk format version" in exc.message
                    and "is not supported" in exc.message):
                raise
            # A daemon older than bulk format 2 (it read nothing: the first frame's magic
            # was refused). Format 1 from now on, for this batch and this connection.
            log.info("%s: %s reads bulk format 1 only; sending format 1", what,
                     transport.base_url)
            transport.bulk_version = batch.version = source.version = 1
            result = transport.request(req)  # the same batch, now in format 1
        if result is None:
            log.debug("%s: %s has no bulk upload route (an older daemon); one PUT per "
                      "partial", what, transport.base_url)
            for i, part in enumerate(batch.all()):
                if i not in answers:
                    answers[i] = put_one(part.key, batch.whole(part))
            break
        indexes = range(len(batch.sent)) if todo is None else todo
        items = result["partials"]
        if len(items) != len(indexes) or not result.get("complete"):
            raise BadResponse(f"{what}: {len(indexes)} partials sent, {len(items)} answered "
                              f"(complete: {result.get('complete')})")
        retry: list[int] = []
        for i, item in zip(indexes, items):
            key = batch.sent[i].key
            if not isinstance(item, dict) or not matches(key, item):
                raise BadResponse(f"{what}: answer {item} is not for {key}")
            if item.get("status") in (PartialStatus.CREATED, PartialStatus.REPLACED):
                check_stored(batch.sent[i], item)
                answers[i] = item
                continue
            error, again = rejection(item, f"{what}: {key}")
            if not again or attempt == policy.attempts:
                raise error
            retry.append(i)
        if not retry:
            break
        todo = retry
        log.warning("%s: %d partials rejected for a passing reason; sending them again "
                    "(try %d of %d)", what, len(retry), attempt + 1, policy.attempts)
        transport._sleep(policy.delay(attempt))
    return [answers[i] for i in range(len(batch.sent))]
