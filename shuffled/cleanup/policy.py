"""Pure expiry decisions: no I/O, no clock of its own, no asyncio.

A supervisor task's data expires ``expiry_timeout`` seconds after its last access (a PUT or a
GET of its partial segments). An expired task is kept while the overlord says the task still
runs, deleted once it says the task finished or does not know it, and, while the overlord
cannot be asked, kept until ``max_age`` seconds after the last access. With no overlord
configured, expiry alone decides.

Druid shipped this check inverted for two years (apache/druid#12692): the tests pin both
directions, running -> keep and finished -> delete.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

RUNNING_STATES = frozenset({"RUNNING", "PENDING", "WAITING"})
FINISHED_STATES = frozenset({"SUCCESS", "FAILED"})


class TaskState(enum.Enum):
    """What the overlord told us about one supervisor task."""

    RUNNING = "running"        # RUNNING, PENDING or WAITING: data still needed
    FINISHED = "finished"      # SUCCESS or FAILED
    UNKNOWN = "unknown"        # the overlord answered but does not know the id
    UNREACHABLE = "unreachable"  # no usable answer (refused, timeout, 5xx, garbage)


class Action(enum.Enum):
    KEEP = "keep"          # not expired yet
    EXTEND = "extend"      # expired, but the task still runs: refresh its expiry
    RETRY = "retry"        # expired, overlord unreachable, below max age: ask next sweep
    DELETE = "delete"


class Cause(str, enum.Enum):
    """The ``cause`` label of shuffled_deleted_tasks_total / shuffled_deleted_bytes_total."""

    REQUEST = "request"
    EXPIRED = "expired"
    MAX_AGE = "max_age"


class Decision:
    __slots__ = ("action", "cause")

    def __init__(self, action: Action, cause: Cause | None = None) -> None:
        self.action = action
        self.cause = cause

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Decision) and self.action is other.action
                and self.cause is other.cause)

    def __repr__(self) -> str:
        return f"Decision({self.action.name}{', ' + self.cause.value if self.cause else ''})"


KEEP = Decision(Action.KEEP)
EXTEND = Decision(Action.EXTEND)
RETRY = Decision(Action.RETRY)
DELETE_EXPIRED = Decision(Action.DELETE, Cause.EXPIRED)
DELETE_MAX_AGE = Decision(Action.DELETE, Cause.MAX_AGE)


def expires_at(last_access: float, expiry_timeout: float) -> float:
    return last_access + expiry_timeout


def is_expired(last_access: float, now: float, expiry_timeout: float) -> bool:
    """Expired once ``now`` reaches last access + timeout."""
    return now >= expires_at(last_access, expiry_timeout)


def past_max_age(last_access: float, now: float, max_age: float) -> bool:
    return now >= last_access + max_age


def decide(last_access: float, now: float, *, expiry_timeout: float, max_age: float,
           state: TaskState | None) -> Decision:
    """What to do with one task. ``state`` is None when no overlord is configured."""
    if not is_expired(last_access, now, expiry_timeout):
        return KEEP
    if state is None:
        return DELETE_EXPIRED
    if state is TaskState.RUNNING:
        return EXTEND
    if is_over(state):
        return DELETE_EXPIRED
    # Unreachable: keep and ask again next sweep, but never past the hard maximum age.
    return DELETE_MAX_AGE if past_max_age(last_access, now, max_age) else RETRY


def is_over(state: TaskState) -> bool:
    """The overlord's answer means the task's data is no longer needed: it finished, or
    the overlord does not know it. Running and unreachable keep the data."""
    return state in (TaskState.FINISHED, TaskState.UNKNOWN)


def _status_code(item: Mapping[str, Any]) -> str | None:
    """The status string of one entry of Druid's task-status answer, in any of its shapes:
    ``{"status": "RUNNING"}``, ``{"statusCode": "RUNNING"}``, ``{"status": {"status": ...}}``
    or ``{"status": {"statusCode": ...}}``."""
    for key in ("statusCode", "status"):
        value = item.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping):
            inner = _status_code(value)
            if inner is not None:
                return inner
    return None


def parse_task_state(item: Any) -> TaskState:
    """One value of the overlord's ``{id: status}`` answer as a TaskState.

    ``None`` (Druid's way of saying "no such task" in some versions) is UNKNOWN; a value we
    cannot read, or a status we do not recognise, is UNREACHABLE: not an answer to act on.
    """
    if item is None:
        return TaskState.UNKNOWN
    if not isinstance(item, Mapping):
        return TaskState.UNREACHABLE
    code = _status_code(item)
    if code is None:
        return TaskState.UNREACHABLE
    code = code.strip().upper()
    if code in RUNNING_STATES:
        return TaskState.RUNNING
    if code in FINISHED_STATES:
        return TaskState.FINISHED
    return TaskState.UNREACHABLE


def parse_status_answer(ids: list[str], answer: Any) -> dict[str, TaskState]:
    """The overlord's whole answer for ``ids``: absent ids are UNKNOWN.

    Raises ValueError when the answer is not a JSON object (garbage: keep everything).
    """
    if not isinstance(answer, Mapping):
        raise ValueError(f"task-status answer is a {type(answer).__name__}, not a JSON object")
    return {i: parse_task_state(answer[i]) if i in answer else TaskState.UNKNOWN for i in ids}
