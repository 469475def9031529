"""Where a phase-1 task's partials go: its daemons in a fixed order, past unusable ones.

Each task has a deterministic ring over the job's daemons starting at ``partition % n``
(the same order every attempt, so placement is reproducible and spread evenly). A flush
goes to the first ``replicas`` daemons of the ring that take it. A daemon that cannot be
reached within a short retry budget, or answers unhealthy, draining or full (any 5xx after
the budget), is skipped for the rest of this task and the flush is sent to the next one,
whole: a daemon that half-stored a flush before it failed is never read for it, since the
task reports the daemons that answered the whole flush. A later task starts from its own
ring again, so a daemon that comes back is used again (docs/failover.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from shuffled.client import RetryPolicy, ShuffleClient, daemon_failed
from shuffled.errors import ShuffleError
from shuffled.protocol import PartialKey
from shuffled.slab.build import Slab

#: Writes give up on a daemon quickly: another one takes the flush just as well. Spans a
#: brief blip (a few seconds), not a restart: a restarting daemon is passed over.
WRITE_RETRY = RetryPolicy(attempts=3, backoff=0.2, max_backoff=1.0, deadline=10.0)

Body = bytes | bytearray | memoryview


class AllDaemonsFailed(ShuffleError):
    """No daemon of the job took a flush: phase 1 cannot place its output anywhere."""

    status = 503
    code = "all_daemons_failed"


def ring(servers: tuple[str, ...], partition: int) -> tuple[str, ...]:
    """The daemons in the order a task of ``partition`` tries them."""
    n = len(servers)
    return tuple(servers[(partition + k) % n] for k in range(n))


@dataclass
class Placed:
    """Where one flush landed: the daemons holding all of it (the first is the one its
    answers came from), its per-partial answers, failovers and time spent on replicas."""

    servers: tuple[str, ...]
    answers: list[dict[str, object]]
    failovers: int
    replica_ms: int


class Placer:
    """One task's daemons and clients (used from the task's upload thread only)."""

    def __init__(self, servers: tuple[str, ...], partition: int, replicas: int,
                 token: str | None, ca_file: str | None,
                 retry: RetryPolicy = WRITE_RETRY) -> None:
        self.order = ring(servers, partition)
        self.replicas = max(1, min(replicas, len(servers)))
        self.down: set[str] = set()
        self.errors: dict[str, str] = {}
        self._token, self._ca_file, self._retry = token, ca_file, retry
        self._clients: dict[str, ShuffleClient] = {}

    def _client(self, server: str) -> ShuffleClient:
        client = self._clients.get(server)
        if client is None:
            client = self._clients[server] = ShuffleClient(
                server, token=self._token, ca_file=self._ca_file, retry=self._retry)
        return client

    def put(self, sup: str, make: Callable[[], Iterable[tuple[PartialKey, Body]]],
            schema: bytes | None = None) -> Placed:
        """Send one flush: ``make()`` gives its partials (again after a failover; a list
        goes out in large chunks, an iterator a partial at a time as it comes): whole streams, or with ``schema`` the bodies of streams of that schema
        (:meth:`ShuffleClient.put_flush`); with replicas, the bodies the first upload cut
        are kept and sent as they are to the others."""
        held: list[tuple[PartialKey, Body]] | None = [] if self.replicas > 1 else None

        def send(server: str, items: Iterable[tuple[PartialKey, Body]]) -> list[dict[str, Any]]:
            client = self._client(server)
            if schema is None:
                return client.put_partials(sup, items)
            return client.put_flush(sup, schema, items)

        def cut() -> Iterator[tuple[PartialKey, Body]]:
            for key, body in make():
                if held is not None:
                    held.append((key, body))
                yield key, body

        servers: list[str] = []
        answers: list[dict[str, object]] = []
        failovers = 0
        replica_ms = 0
        for server in self.order:
            if server in self.down or len(servers) == self.replicas:
                continue
            started = time.monotonic()
            try:
                if not servers:
                    if held is not None:
                        held.clear()
                    answers = send(server, cut())
                else:
                    assert held is not None  # replicas > 1 keeps the bodies
                    send(server, held)
                    replica_ms += int((time.monotonic() - started) * 1000)
            except Exception as exc:
                self._down(server, exc)
                failovers += 1
                continue
            servers.append(server)
        if not servers:
            raise self._none_took(f"the partials of {sup}")
        if held is not None:
            held.clear()
        return Placed(tuple(servers), answers, failovers, replica_ms)

    def put_slab(self, sup: str, slab: Slab) -> Placed:
        """Store one slab on the first ``replicas`` daemons of the ring that take it (the
        same bytes to each), failing over as :meth:`put` does."""
        servers: list[str] = []
        failovers = 0
        replica_ms = 0
        for server in self.order:
            if server in self.down or len(servers) == self.replicas:
                continue
            started = time.monotonic()
            try:
                self._client(server).put_slab(sup, slab)
            except Exception as exc:
                self._down(server, exc)
                failovers += 1
                continue
            if servers:
                replica_ms += int((time.monotonic() - started) * 1000)
            servers.append(server)
        if not servers:
            raise self._none_took(f"a slab of {sup}")
        return Placed(tuple(servers), [], failovers, replica_ms)

    def _down(self, server: str, exc: Exception) -> None:
        """``server`` failed a send: out of the ring for this task (or, if the failure is
        the task's own, not the daemon's, raised as it is)."""
        if not daemon_failed(exc):
            raise exc
        self.down.add(server)
        self.errors[server] = getattr(exc, "message", None) or repr(exc)
        self._close(server)

    def _none_took(self, what: str) -> AllDaemonsFailed:
        tried = "; ".join(f"{s}: {e}" for s, e in self.errors.items())
        return AllDaemonsFailed(f"no shuffle daemon took {what}: {tried}",
                                servers=sorted(self.errors))

    def _close(self, server: str) -> None:
        client = self._clients.pop(server, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for server in list(self._clients):
            self._close(server)
