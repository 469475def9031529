"""JSON shapes of the task listings (GET /tasks and GET /tasks/{sup})."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shuffled.protocol import crc_hex
from shuffled.storage import Location, TaskEntry


def task_summary(entry: TaskEntry, expiry_timeout: float) -> dict[str, Any]:
    """Per-task figures: held, served (the seed's shuffle bytes per task), received, expiry."""
    return {
        "supervisorTaskId": entry.supervisor_task_id,
        "bytes": entry.bytes,
        "files": entry.files,
        "partitions": len(entry.partitions),
        "lastAccess": entry.last_access,
        "expiresAt": entry.last_access + expiry_timeout,
        "servedBytes": entry.served_bytes,
        "servedRequests": entry.served_requests,
        "receivedBytes": entry.received_bytes,
        "receivedPartials": entry.received_partials,
    }


def task_detail(entry: TaskEntry, expiry_timeout: float,
                locations: Sequence[Location]) -> dict[str, Any]:
    partitions = []
    for (interval, pid), subs in sorted(entry.partitions.items()):
        partitions.append({
            "start": interval.start_iso,
            "end": interval.end_iso,
            "partitionId": pid,
            "bytes": sum(m.size for m in subs.values()),
            "rows": sum(m.rows for m in subs.values()),
            "subTasks": [
                {"subTaskId": sub, "bytes": m.size, "rows": m.rows, "crc32c": crc_hex(m.crc),
                 "generation": m.generation, "location": str(locations[m.location].path)}
                for sub, m in sorted(subs.items())
            ],
        })
    body = task_summary(entry, expiry_timeout)
    body["partitions"] = partitions
    return body
