"""shuffled's own Python client (what phase 1 uses) as the bench's uploader where curl has
no equivalent: the bulk route (``ShuffleClient.put_partials``, one streamed request for
many partials) and single PUTs from several threads, each with its own client, like Spark
tasks on one executor.

Every answer is checked: a partial the daemon did not store fails the run instead of
making a side "win".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey
from shuffled.slab.build import Slab

Item = tuple[PartialKey, bytes]
STORED = {"created", "replaced"}


def keys(sup: str, subs: Sequence[str], interval: Interval, partition: int = 0,
         ) -> list[PartialKey]:
    """One key per subtask id, all in one partition of task ``sup``."""
    return [PartialKey(sup, sub, interval, partition) for sub in subs]


def _check(answers: list[dict[str, Any]], items: Sequence[Item]) -> None:
    """RuntimeError unless every item got a stored answer of its size."""
    if len(answers) != len(items):
        raise RuntimeError(f"bulk upload answered {len(answers)} of {len(items)} partials")
    for (key, body), answer in zip(items, answers):
        if answer.get("status") not in STORED or answer.get("bytes") != len(body):
            raise RuntimeError(f"bulk upload did not store {key}: {str(answer)[:300]}")


def put_bulk(url: str, sup: str, items: Sequence[Item], timeout: float = 300.0,
             token: str | None = None) -> float:
    """Store ``items`` with ONE ``put_partials`` request; wall seconds (client made inside)."""
    began = time.perf_counter()
    with ShuffleClient(url, timeout=timeout, token=token) as c:
        _check(c.put_partials(sup, list(items)), items)
    return time.perf_counter() - began


def put_slab(url: str, sup: str, slab: Slab, timeout: float = 300.0) -> float:
    """Store one slab (``put_slab``); wall seconds (client made inside)."""
    began = time.perf_counter()
    with ShuffleClient(url, timeout=timeout) as c:
        ack = c.put_slab(sup, slab)
    if ack.get("rows") != slab.rows:
        raise AssertionError(f"slab stored {ack.get('rows')} rows of {slab.rows}")
    return time.perf_counter() - began


def put_threads(url: str, items: Sequence[Item], threads: int, timeout: float = 300.0,
                token: str | None = None) -> float:
    """PUT each item once (``put_partial``), ``threads`` in flight, each thread with its own
    client pulling the next item from a shared cursor; wall seconds."""
    nxt, lock = iter(range(len(items))), threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        """One thread: its own client, items until none is left or one failed."""
        with ShuffleClient(url, timeout=timeout, token=token) as c:
            while not errors:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                key, body = items[i]
                try:
                    answer = c.put_partial(key, body)
                    if answer.get("bytes", len(body)) != len(body):
                        raise RuntimeError(f"PUT {key}: stored {answer}")
                except BaseException as exc:  # surfaced by the caller
                    errors.append(exc)
                    return

    return _run_threads(work, threads, errors, timeout)


def _run_threads(work: Callable[[], None], threads: int, errors: list[BaseException],
                 timeout: float) -> float:
    """Run ``work`` on ``threads`` threads; wall seconds; the first error re-raised."""
    began = time.perf_counter()
    pool = [threading.Thread(target=work, name=f"bench-put-{i}", daemon=True)
            for i in range(threads)]
    for t in pool:
        t.start()
    deadline = began + timeout
    for t in pool:
        t.join(max(0.0, deadline - time.perf_counter()))
    seconds = time.perf_counter() - began
    if any(t.is_alive() for t in pool):
        raise TimeoutError(f"uploads still running after {timeout:.0f} s")
    if errors:
        raise errors[0]
    return seconds


def delete(url: str, sup: str, token: str | None = None) -> None:
    """Remove task ``sup`` (untimed clean-up between samples)."""
    with ShuffleClient(url, timeout=120, token=token) as c:
        c.delete_task(sup)
