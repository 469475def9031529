"""Paged partition reads, seals and task states, on the client side.

:func:`read_page` asks for one page (a lost answer is simply asked again: the same token
gives the same bytes); :func:`iter_pages` walks a partition to its end, long-polling when
it is up to date but not complete, and acknowledges the last token. Pages are returned as
bytes (each a whole Arrow IPC stream); decoding is the caller's (this package imports no
pyarrow).
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from shuffled.client.digest import check_crc, crc32c_of
from shuffled.client.http import Request, Transport
from shuffled.errors import ReadAgain, ShuffleError, TaskFailed
from shuffled.protocol import (
    COMPLETE_HEADER, CONTENT_DIGEST, NEXT_TOKEN_HEADER, PENDING_BYTES_HEADER,
    TASK_STATE_HEADER, PartitionKey, TaskDataState, parse_crc32c, task_path,
)


class NotComplete(ShuffleError):
    """A partition did not read as complete within the reader's time (not sealed yet, or
    a sealed subtask's partial is not on this daemon)."""

    status = 504
    code = "not_complete"


@dataclass(frozen=True, kw_only=True)
class Page:
    """One answer: its bytes (empty when there was nothing new), the token to ask next,
    whether the partition is complete, stored bytes still to come, the task's state."""

    token: int
    body: bytes
    next_token: int
    complete: bool
    pending_bytes: int
    state: str  # a TaskDataState value (kept as sent: a newer daemon may name others)


def _query(key: PartitionKey, subs: Sequence[str] | None) -> list[tuple[str, str]]:
    query = list(key.query().items())
    if subs is not None:
        query += [("subTaskId", s) for s in subs]
    return query


def read_page(http_: Transport, key: PartitionKey, token: int, *, max_bytes: int,
              max_wait: float = 0.0, subs: Sequence[str] | None = None) -> Page:
    """``GET .../partition/pages``: the page at ``token``, its digest checked."""
    query = _query(key, subs) + [("token", str(token)), ("maxBytes", str(max_bytes))]
    if max_wait > 0:
        query.append(("maxWait", f"{max_wait:g}"))

    def handle(resp: http.client.HTTPResponse) -> Page:
        body = resp.read()
        check_crc(crc32c_of(body), parse_crc32c(resp.getheader(CONTENT_DIGEST)),
                  f"{key} page {token}")
        return Page(token=token, body=body,
                    next_token=int(resp.getheader(NEXT_TOKEN_HEADER) or token),
                    complete=resp.getheader(COMPLETE_HEADER) == "true",
                    pending_bytes=int(resp.getheader(PENDING_BYTES_HEADER) or 0),
                    state=resp.getheader(TASK_STATE_HEADER) or TaskDataState.NONE)

    return http_.request(Request("GET", f"{task_path(key.supervisor_task_id)}/partition/pages",
                                 query=query, handle=handle, what=f"page {token} of {key}"))


def ack_page(http_: Transport, key: PartitionKey, token: int) -> None:
    """``DELETE .../partition/pages?token``: Presto's acknowledge (releases nothing that
    the data needs; the daemon keeps no per-reader state)."""
    http_.request(Request("DELETE", f"{task_path(key.supervisor_task_id)}/partition/pages",
                          query=list(key.query().items()) + [("token", str(token))],
                          handle=lambda resp: resp.read(), what=f"ack {token} of {key}"))


def iter_pages(http_: Transport, key: PartitionKey, *, max_bytes: int = 8 << 20,
               subs: Sequence[str] | None = None, poll: float = 10.0,
               deadline: float = 600.0,
               clock: Callable[[], float] = time.monotonic) -> Iterator[bytes]:
    """Every page of the partition from the start until it is complete (the task sealed
    and every sealed partial passed), long-polling ``poll`` seconds at a time while it is
    up to date but not complete. Raises TaskFailed for a failed task, NotComplete after
    ``deadline`` seconds without reaching the end."""
    token = 0
    started = clock()
    wait = 0.0  # ask at once; after an answer with nothing new, wait for news
    yielded = False
    while True:
        try:
            page = read_page(http_, key, token, max_bytes=max_bytes, subs=subs, max_wait=wait)
        except ReadAgain:
            # The seal left out an attempt whose pages this reader passed. Nothing handed
            # on yet: start over here; else the caller holds pages that are not the
            # committed data and must discard them (a Spark task fails and is retried).
            if yielded:
                raise
            token, wait = 0, 0.0
            continue
        if page.state == TaskDataState.FAILED:
            raise TaskFailed(f"{key.supervisor_task_id} was marked failed on the daemon: "
                             f"{key} will never be complete", partition=key.partition_id)
        if page.body:
            yielded = True
            yield page.body
            started = clock()  # progress: the deadline counts from here
        token = page.next_token
        if page.complete:
            ack_page(http_, key, token)
            return
        wait = 0.0 if page.body else poll
        if not page.body and clock() - started > deadline:
            raise NotComplete(f"{key} is not complete after {deadline:g} s (task state "
                              f"{page.state}); was the task sealed with its committed "
                              "subtasks?", partition=key.partition_id)
