"""What the listings and status answers show: task listings (GET /tasks and GET
/tasks/{sup}) and the locations' file-system figures (GET /status and the status page)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shuffled.protocol import crc_hex
from shuffled.storage import Location, PartialMeta, TaskEntry


def task_summary(entry: TaskEntry, expiry_timeout: float) -> dict[str, Any]:
    """Per-task figures: held, served (the seed's shuffle bytes per task), received, expiry."""
    return {
        "supervisorTaskId": entry.supervisor_task_id,
        "bytes": entry.bytes,
        "files": entry.files,
        "partitions": entry.partitions,
        "lastAccess": entry.last_access,
        "expiresAt": entry.last_access + expiry_timeout,
        "servedBytes": entry.served_bytes,
        "servedRequests": entry.served_requests,
        "receivedBytes": entry.received_bytes,
        "receivedPartials": entry.received_partials,
    }


def task_detail(entry: TaskEntry, expiry_timeout: float, locations: Sequence[Location],
                metas: Sequence[PartialMeta], next_cursor: str | None) -> dict[str, Any]:
    """A task's summary plus one page of its partials, grouped by partition (a partition
    cut by the page's end continues on the next page)."""
    partitions: list[dict[str, Any]] = []
    for meta in metas:
        k = meta.key
        if not partitions or partitions[-1]["_slot"] != meta.slot:
            partitions.append({"_slot": meta.slot, "start": k.interval.start_iso,
                               "end": k.interval.end_iso, "partitionId": k.partition_id,
                               "bytes": 0, "rows": 0, "subTasks": []})
        part = partitions[-1]
        part["bytes"] += meta.size
        part["rows"] += meta.rows
        part["subTasks"].append({
            "subTaskId": k.sub_task_id, "bytes": meta.size, "rows": meta.rows,
            "crc32c": crc_hex(meta.crc), "generation": meta.generation,
            "location": str(locations[meta.location].path)})
    for part in partitions:
        del part["_slot"]
    body = task_summary(entry, expiry_timeout)
    body["partitions"] = partitions
    body["nextCursor"] = next_cursor
    return body


def disk_usages(locations: Sequence[Location]) -> list[tuple[int, int]]:
    """(file system bytes, free bytes) of each location, (-1, -1) where it cannot be read;
    blocking (statvfs): run it on the store's I/O threads."""
    out = []
    for loc in locations:
        try:
            out.append(loc.disk_usage())
        except OSError:
            out.append((-1, -1))
    return out
