"""Reading many partitions of one task with one request (``POST /tasks/{sup}/partitions``).

The answer is framed (:mod:`shuffled.framing`): one frame per partition asked for, in
order, each body an aggregate Arrow IPC stream checked against the CRC32C in its header,
then an END frame. An answer cut before END raises a connection error, which the
transport's retry loop answers by asking again (reads are idempotent).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Sequence

from shuffled.client.answers import domain_error
from shuffled.client.http import Request, Transport
from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch
from shuffled.framing import (
    FIXED_LEN, FramingError, end_count, parse_fixed, parse_header,
    partition_of,
)
from shuffled.protocol import PartitionKey

MAX_PER_REQUEST = 256  # partitions per request (the daemon takes up to 1000)

Wanted = tuple[PartitionKey, Sequence[str] | None]
# One partition's answer: its bytes, or None when the daemon says to use the single GET.
Answer = tuple[PartitionKey, bytes | None]


def request_body(wanted: Sequence[Wanted]) -> bytes:
    items = []
    for key, subs in wanted:
        item: dict[str, object] = {"start": key.interval.start_iso, "end": key.interval.end_iso,
                                   "partitionId": key.partition_id}
        if subs is not None:
            item["subTaskIds"] = list(subs)
        items.append(item)
    return json.dumps({"partitions": items}, separators=(",", ":")).encode()


def _exact(resp: http.client.HTTPResponse, n: int) -> bytes:
    data = resp.read(n) if n else b""
    if len(data) != n:
        raise http.client.IncompleteRead(data, n - len(data))
    return data


def reader(sup: str, wanted: Sequence[Wanted]) -> Callable[[http.client.HTTPResponse], list[Answer] | None]:
    """The response handler: every frame read and checked; None for a daemon without
    the route (404/405)."""

    def handle(resp: http.client.HTTPResponse) -> list[Answer] | None:
        if resp.status in (404, 405):
            _missing_route(resp, sup)  # raises NotFound unless the route is missing
            return None
        out: list[Answer] = []
        while True:
            frame = parse_fixed(_exact(resp, FIXED_LEN))
            header = parse_header(frame, _exact(resp, frame.header_len))
            if frame.end:
                if end_count(header) != len(wanted) or len(out) != len(wanted):
                    raise FramingError(f"answer has {len(out)} partitions, asked for "
                                       f"{len(wanted)}")
                return out
            key, crc = partition_of(sup, header)
            if len(out) >= len(wanted) or key != wanted[len(out)][0]:
                raise FramingError(f"answer frame {len(out)} is {key}, not what was asked")
            body = _exact(resp, frame.body_len)
            if header.get("fallback"):
                out.append((key, None))
                continue
            if crc32c(body) != crc:
                raise DigestMismatch(f"{key}: the bulk read's frame fails its CRC32C",
                                     partition=str(key))
            out.append((key, body))

    return handle


def _missing_route(resp: http.client.HTTPResponse, sup: str) -> None:
    """None for a daemon without the route (405, or a 404 naming no partition: an older
    daemon); a 404 naming a partition or subtasks is raised as NotFound."""
    try:
        body = json.loads(resp.read() or b"{}")
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    if resp.status == 404 and ("partition" in body or "missing" in body):
        raise domain_error(404, body, f"bulk read of partitions of {sup}")
    return None


def read(transport: Transport, path: str, sup: str, wanted: Sequence[Wanted],
         ) -> list[Answer] | None:
    """One bulk read of ``wanted`` (at most :data:`MAX_PER_REQUEST`); None if the daemon
    has no such route."""
    return transport.request(Request(
        "POST", path, body=request_body(wanted), headers={"Content-Type": "application/json"},
        handle=reader(sup, wanted), what=f"bulk read of {len(wanted)} partitions of {sup}",
        accept=(404, 405)))
