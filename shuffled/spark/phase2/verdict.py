"""What a merge task learns of the driver's verdict on lost daemons.

The driver declares a daemon lost within seconds of its heartbeats finding it gone and
tells every surviving daemon (:mod:`shuffled.spark.driver.monitor`, ``PUT
.../tasks/{id}/lost``). A merge task's reads retry a daemon that does not answer for
``shuffleRetrySeconds`` (a restart is ridden through); between those retries, never on a
read that succeeds, :class:`Verdict` asks a survivor (``GET .../tasks/{id}/lost``, one try,
a short timeout, at most once per :data:`ASK_EVERY` seconds for the whole task) whether the
daemon was declared lost. If it was, the read gives up at once (the client's
``RetryPolicy.abandon``) and the partition is reported lost as after the whole budget: the
driver recomputes only what was lost (docs/failover.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence

from shuffled.client import RetryPolicy, ShuffleClient
from shuffled.client.http import NO_RETRY

ASK_EVERY = 1.0  # seconds between two questions to the survivors, for the whole task
ASK_TIMEOUT = 2.0  # a survivor that does not answer within this is skipped
ASK_AT_MOST = 2  # survivors asked per question (the next question tries the others)


class Verdict:
    """The daemons of a task its driver declared lost, as far as this merge task knows.

    ``servers`` are the task's daemons; ``down`` the ones this task found gone itself
    (never asked). Thread-safe: the fetch thread and the task's own thread share one.
    """

    def __init__(self, supervisor_task_id: str, servers: Sequence[str], down: Collection[str],
                 *, token: str | None = None, ca_file: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.task_id = supervisor_task_id
        self.servers = list(servers)
        self.down = down
        self.token, self.ca_file = token, ca_file
        self.clock = clock
        self.lost: dict[str, str] = {}  # declared lost -> the survivor that said so
        self.asked = 0  # questions sent (the happy path sends none)
        self._asked_at: float | None = None
        self._lock = threading.Lock()
        self._clients: dict[str, ShuffleClient] = {}
        self._next = 0  # round robin over the survivors

    def declared(self, server: str) -> str | None:
        """Why to give up on ``server`` now (the driver declared it lost), or None.

        Answers from what is known, asking the survivors first if the last question is
        :data:`ASK_EVERY` seconds old or more."""
        with self._lock:
            if server not in self.lost:
                now = self.clock()
                if self._asked_at is None or now - self._asked_at >= ASK_EVERY:
                    self._asked_at = now
                    self._ask(server)
            said = self.lost.get(server)
        return None if said is None else f"{server} was declared lost by the driver (told by {said})"

    def policy(self, base: RetryPolicy, server: str) -> RetryPolicy:
        """``base`` for reads of ``server``, given up as soon as it is declared lost."""
        return RetryPolicy(attempts=base.attempts, backoff=base.backoff,
                           max_backoff=base.max_backoff, deadline=base.deadline,
                           abandon=lambda: self.declared(server))

    def _ask(self, server: str) -> None:
        survivors = [s for s in self.servers
                     if s != server and s not in self.down and s not in self.lost]
        if not survivors:
            return
        start = self._next % len(survivors)
        for other in (survivors[start:] + survivors[:start])[:ASK_AT_MOST]:
            self._next += 1
            self.asked += 1
            client = self._clients.get(other)
            if client is None:
                client = self._clients[other] = ShuffleClient(
                    other, token=self.token, ca_file=self.ca_file, timeout=ASK_TIMEOUT,
                    retry=NO_RETRY)
            try:
                named = client.lost_daemons(self.task_id)
            except Exception:  # not an answer: ask another (a daemon without the route too)
                client.close()
                continue
            for s in named:
                self.lost.setdefault(s, other)
            return

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
