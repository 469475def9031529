"""Asking a Druid overlord whether supervisor tasks still run (aiohttp's client side only).

Druid's multi-task status API: ``POST {overlord}/druid/indexer/v1/taskStatus`` with a JSON list
of task ids; the answer is a JSON object from id to a status object (``{"id": ..., "status":
"RUNNING" | "SUCCESS" | "FAILED", ...}``, or the ``statusCode`` / nested ``status`` shapes of
other Druid versions); ids the overlord does not know are absent. Ids go in batches; each
batch that gets no usable answer (connection refused, timeout, non-200, garbage) leaves its
ids UNREACHABLE, so the sweeper keeps them and asks again next sweep.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

import aiohttp

from shuffled.cleanup.policy import TaskState, parse_status_answer
from shuffled.metrics import Metrics, OverlordOutcome

log = logging.getLogger("shuffled.cleanup")

TASK_STATUS_PATH = "/druid/indexer/v1/taskStatus"
DEFAULT_TIMEOUT = 10.0
DEFAULT_BATCH = 100
MAX_ANSWER_BYTES = 16 << 20  # a status object is well under 1 KiB; 100 of them fit easily


class OverlordClient:
    """Task-status calls to one overlord, on one aiohttp ClientSession opened on first use."""

    def __init__(self, base_url: str, metrics: Metrics | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT, batch_size: int = DEFAULT_BATCH) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + TASK_STATUS_PATH
        self.metrics = metrics
        self.timeout = timeout
        self.batch_size = batch_size
        self._session: aiohttp.ClientSession | None = None
        if metrics is not None:
            for outcome in OverlordOutcome:
                metrics.overlord_requests.labels(outcome)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"Accept": "application/json"}, raise_for_status=False)
        return self._session

    def _count(self, outcome: OverlordOutcome) -> None:
        if self.metrics is not None:
            self.metrics.overlord_requests.labels(outcome).inc()

    async def statuses(self, task_ids: Sequence[str]) -> dict[str, TaskState]:
        """The state of every id in ``task_ids``; never raises for an unreachable overlord."""
        out: dict[str, TaskState] = {}
        ids = list(dict.fromkeys(task_ids))
        for start in range(0, len(ids), max(1, self.batch_size)):
            batch = ids[start:start + max(1, self.batch_size)]
            out.update(await self._batch(batch))
        return out

    async def _batch(self, ids: list[str]) -> dict[str, TaskState]:
        unreachable = dict.fromkeys(ids, TaskState.UNREACHABLE)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with self._client().post(self.url, json=ids, timeout=timeout) as resp:
                if resp.status != 200:
                    self._count(OverlordOutcome.HTTP_ERROR)
                    log.warning("overlord %s answered HTTP %d to a task-status call; keeping "
                                "%d expired tasks until it answers", self.url, resp.status,
                                len(ids))
                    return unreachable
                raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
        except asyncio.TimeoutError:
            self._count(OverlordOutcome.TIMEOUT)
            log.warning("overlord %s did not answer within %.1f s; keeping %d expired tasks",
                        self.url, self.timeout, len(ids))
            return unreachable
        except (aiohttp.ClientError, OSError) as exc:
            self._count(OverlordOutcome.UNREACHABLE)
            log.warning("overlord %s unreachable (%s); keeping %d expired tasks", self.url,
                        exc, len(ids))
            return unreachable
        try:
            if len(raw) > MAX_ANSWER_BYTES:
                raise ValueError(f"answer larger than {MAX_ANSWER_BYTES} bytes")
            answer = parse_status_answer(ids, json.loads(raw))
        except (ValueError, RecursionError) as exc:
            self._count(OverlordOutcome.BAD_ANSWER)
            log.warning("overlord %s sent an unreadable task-status answer (%s); keeping %d "
                        "expired tasks", self.url, exc, len(ids))
            return unreachable
        self._count(OverlordOutcome.OK)
        return answer
