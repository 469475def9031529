"""How hard a client call tries, and which failures are worth another try.

A call is retried on connection errors and on the statuses :func:`is_retryable` names, with
backoff and jitter per :class:`RetryPolicy`; :func:`daemon_failed` tells a caller with other
daemons (replicas, a ring) whether to go to the next one.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shuffled.errors import BadTierCopy, CorruptData, LocationFailed, ShuffleError

# Statuses worth another try; 507 only when the server says a location failed (another disk may
# take the data), never for "everything is full".
_RETRY_STATUSES = frozenset({500, 502, 503, 504})


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How hard a client call tries before giving up.

    ``attempts`` counts tries without progress (a resumed download that received more bytes
    starts its count afresh); sleeps start at ``backoff`` seconds and double, with jitter, up
    to ``max_backoff``; a 503's ``Retry-After`` is honoured up to ``4 * max_backoff``. No retry
    starts once ``deadline`` seconds have passed since the call began (or since its last
    progress, so a long transfer is not cut off just for being long). ``abandon``, if
    given, is asked after each failed try: a reason (not None) gives up at once with
    :class:`ShuffleUnavailable` naming it (phase 2 asks whether the driver declared the
    daemon lost, :mod:`shuffled.spark.phase2.verdict`).
    """

    attempts: int = 6
    backoff: float = 0.2
    max_backoff: float = 5.0
    deadline: float = 120.0
    abandon: Callable[[], str | None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be >= 1")
        if self.backoff < 0 or self.max_backoff < 0 or self.deadline < 0:
            raise ValueError("RetryPolicy backoff, max_backoff and deadline must be >= 0")

    def delay(self, failures: int) -> float:
        """Sleep before the next try after ``failures`` consecutive failed tries (>= 1)."""
        base = min(self.max_backoff, self.backoff * (2.0 ** max(0, failures - 1)))
        return base * (0.5 + random.random() / 2)


NO_RETRY = RetryPolicy(attempts=1, backoff=0.0, max_backoff=0.0, deadline=0.0)


class ShuffleUnavailable(ShuffleError):
    """The server could not be reached (connection refused, reset, timed out) within the policy."""

    status = 503
    code = "unavailable"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP-date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def is_retryable(status: int, error: ShuffleError) -> bool:
    """Whether an answer with this status and error is worth another try."""
    if isinstance(error, (CorruptData, BadTierCopy)):
        return False  # the stored bytes are damaged: asking again returns the same damage
    if status in _RETRY_STATUSES:
        return True
    return status == 507 and error.code == LocationFailed.code


def daemon_failed(exc: BaseException) -> bool:
    """Whether a call that failed (after its retries) failed because of the daemon: it did
    not answer (:class:`ShuffleUnavailable`) or answered 5xx (unhealthy, draining, full).
    Then another daemon (a replica, the next of a ring) may serve; any other error is the
    request's own. CorruptData is not the daemon's: those stored bytes are damaged."""
    return isinstance(exc, ShuffleUnavailable) or (
        isinstance(exc, ShuffleError) and exc.status >= 500 and not isinstance(exc, CorruptData))
