"""A request's addresses: the partition or partial a route names (its path and
``start``, ``end``, ``partitionId`` query) and the subtasks it restricts a read to,
parsed and validated (BadRequest naming the field)."""

from __future__ import annotations

from aiohttp import web

from shuffled.protocol import (
    Interval, PartialKey, PartitionKey, parse_partition_id, validate_id,
)


def partition_key(request: web.Request) -> PartitionKey:
    sup = validate_id(request.match_info["sup"], "supervisorTaskId")
    interval = Interval.parse(request.query.get("start"), request.query.get("end"))
    return PartitionKey(sup, interval, parse_partition_id(request.query.get("partitionId")))


def partial_key(request: web.Request) -> PartialKey:
    part = partition_key(request)
    sub = validate_id(request.match_info["sub"], "subTaskId")
    return PartialKey(part.supervisor_task_id, sub, part.interval, part.partition_id)


def sub_task_ids(request: web.Request) -> list[str] | None:
    """The ``subTaskId`` values a read names (repeatable), or None for every subtask."""
    subs = request.query.getall("subTaskId", None)
    return None if subs is None else [validate_id(s, "subTaskId") for s in subs]
