"""Bulk upload from the client side: frames streamed as the caller produces partials.

The caller's iterable is consumed lazily, so a phase-1 task encodes the next partial
while the previous ones are on the wire. What was sent is kept (references, no copies) so
that a retry resends the whole batch: replacing a key is idempotent on the daemon.
"""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from shuffled import framing
from shuffled.client.digest import crc32c_of
from shuffled.client.http import FLUSH, BadResponse, Transport, domain_error, is_retryable
from shuffled.errors import DigestMismatch, ShuffleError
from shuffled.protocol import PartialKey, crc_hex

log = logging.getLogger("shuffled.client")

Body = bytes | bytearray | memoryview
Sent = tuple[PartialKey, memoryview, int]  # key, body, CRC32C of the body
PutOne = Callable[[PartialKey, memoryview], dict[str, Any]]


class Batch:
    """A replayable stream of frames over ``partials``: call it for each try.

    The source is pulled one partial at a time, only when its frame is about to be sent;
    before pulling from a lazy source (not a list or tuple) the frames already made are
    flushed onto the wire, so they travel while the caller produces the next one.
    """

    def __init__(self, supervisor_task_id: str, partials: Iterable[tuple[PartialKey, Body]]) -> None:
        self.sup = supervisor_task_id
        self._lazy = not isinstance(partials, (list, tuple))
        self._source = iter(partials)
        self.sent: list[Sent] = []
        self.exhausted = False

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
        self.sent.append((key, view, crc32c_of(view)))
        return True

    def empty(self) -> bool:
        """True if the source yields nothing (pulls its first partial to know)."""
        return not self.sent and not self._pull()

    def __call__(self) -> Iterator[bytes | memoryview]:
        count = 0
        while count < len(self.sent) or self._pull():
            key, view, crc = self.sent[count]
            yield framing.encode(key, view.nbytes, crc)
            yield view
            count += 1
            if self._lazy and count == len(self.sent) and not self.exhausted:
                yield FLUSH  # the caller may take a while to produce the next one
        yield framing.encode_end(count)

    def all(self) -> list[Sent]:
        """Every partial of the batch (the rest of the source consumed if need be)."""
        while self._pull():
            pass
        return self.sent


def check_stored(sent: Sent, item: dict[str, Any]) -> None:
    """The daemon's answer for a stored partial matches what was sent."""
    key, view, crc = sent
    if item.get("crc32c") != crc_hex(crc):
        raise DigestMismatch(f"{key}: sent CRC32C {crc_hex(crc)}, the server stored "
                             f"{item.get('crc32c')}", key=str(key))
    size = item.get("bytes")
    if size != view.nbytes:
        raise DigestMismatch(f"{key}: sent {view.nbytes} bytes, the server stored {size}",
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
    for attempt in range(1, policy.attempts + 1):
        source = batch if todo is None else Batch(batch.sup, [batch.sent[i][:2] for i in todo])
        result = transport.request("POST", path, headers={"Content-Type": framing.MEDIA_TYPE},
                                   stream=source, handle=_answer, what=what, accept=(404, 405))
        if result is None:
            log.debug("%s: %s has no bulk upload route (an older daemon); one PUT per "
                      "partial", what, transport.base_url)
            for i, (key, view, _) in enumerate(batch.all()):
                if i not in answers:
                    answers[i] = put_one(key, view)
            break
        indexes = range(len(batch.sent)) if todo is None else todo
        items = result["partials"]
        if len(items) != len(indexes) or not result.get("complete"):
            raise BadResponse(f"{what}: {len(indexes)} partials sent, {len(items)} answered "
                              f"(complete: {result.get('complete')})")
        retry: list[int] = []
        for i, item in zip(indexes, items):
            key = batch.sent[i][0]
            if not isinstance(item, dict) or not matches(key, item):
                raise BadResponse(f"{what}: answer {item} is not for {key}")
            if item.get("status") in ("created", "replaced"):
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
