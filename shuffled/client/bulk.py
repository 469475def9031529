"""Bulk upload from the client side: frames streamed as the caller produces partials.

The caller's iterable is consumed lazily, so a phase-1 task encodes the next partial
while the previous ones are on the wire. What was sent is kept (references, no copies) so
that a retry resends the whole batch: replacing a key is idempotent on the daemon.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from shuffled import framing
from shuffled.client.digest import crc32c_of
from shuffled.errors import DigestMismatch
from shuffled.protocol import PartialKey, crc_hex

Sent = tuple[PartialKey, memoryview, int]  # key, body, CRC32C of the body


class Batch:
    """A replayable stream of frames over ``partials``: call it for each try."""

    def __init__(self, supervisor_task_id: str,
                 partials: Iterable[tuple[PartialKey, bytes | bytearray | memoryview]]) -> None:
        self.sup = supervisor_task_id
        self._source = iter(partials)
        self.sent: list[Sent] = []
        self.exhausted = False

    def _take(self) -> Iterator[Sent]:
        yield from self.sent
        for key, body in self._source:
            if key.supervisor_task_id != self.sup:
                raise ValueError(f"{key} does not belong to supervisor task {self.sup}")
            view = memoryview(body).cast("B")
            item = (key, view, crc32c_of(view))
            self.sent.append(item)
            yield item
        self.exhausted = True

    def __call__(self) -> Iterator[bytes | memoryview]:
        count = 0
        for key, view, crc in self._take():
            yield framing.encode(key, view.nbytes, crc)
            yield view
            count += 1
        yield framing.encode_end(count)

    def all(self) -> list[Sent]:
        """Every partial of the batch (the rest of the source consumed if need be)."""
        for _ in self._take():
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
    return (item.get("subTaskId") == key.sub_task_id
            and item.get("start") == key.interval.start_iso
            and item.get("end") == key.interval.end_iso
            and item.get("partitionId") == key.partition_id)
