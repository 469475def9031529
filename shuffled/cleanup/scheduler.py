"""Runs the sweeper every ``sweep_period`` on apscheduler 3.x (the only module importing it).

:func:`sweeper_ctx` is an aiohttp ``cleanup_ctx``: it starts an AsyncIOScheduler on the app's
event loop once the store is open and, on shutdown, stops scheduling, waits for a sweep in
progress and closes the overlord client before the store closes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from shuffled.cleanup.sweeper import Sweeper

log = logging.getLogger("shuffled.cleanup")
JOB_ID = "shuffled-expiry-sweep"


def make_scheduler(sweeper: Sweeper, period: float) -> AsyncIOScheduler:
    """A scheduler (not started) with one interval job: a sweep every ``period`` seconds,
    never two at once (max_instances=1), missed runs collapsed into one (coalesce)."""

    async def sweep() -> None:
        try:
            await sweeper.run_once()
        except Exception:
            # Counted in shuffled_sweep_failures_total by run_once; the next period retries.
            log.exception("expiry sweep failed")

    scheduler = AsyncIOScheduler(timezone="UTC")
    scheduler.add_job(sweep, "interval", seconds=period, id=JOB_ID, name="expiry sweep",
                      max_instances=1, coalesce=True, misfire_grace_time=max(1, int(period)))
    return scheduler


def sweeper_ctx(sweeper: Sweeper, period: float) -> Callable[[Any], AsyncIterator[None]]:
    """An aiohttp cleanup_ctx running ``sweeper`` every ``period`` seconds."""

    async def ctx(app: Any) -> AsyncIterator[None]:
        scheduler = make_scheduler(sweeper, period)
        scheduler.start()
        sweeper.metrics.sweep_period.set(period)
        log.debug("expiry sweeper scheduled every %.3g s", period)
        try:
            yield
        finally:
            scheduler.pause()
            sweeper.metrics.sweep_period.set(0)
            await sweeper.close()  # waits for a sweep in progress to finish
            scheduler.shutdown(wait=False)

    return ctx
