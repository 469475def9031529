"""Where a partial segment lives on disk, and its JSON sidecar.

``<location>/<supervisorTaskId>/<start>_<end>/<partitionId>/<subTaskId>/<generation>.arrow``
with ``<generation>.json`` beside it. Each id is one path component of its own, so an id of
the full 255 characters still fits the file system's name limit. A new generation of a key is a new file name, so replacing a
key never rewrites a file a reader may hold open; the older generation is unlinked after
the newer one is committed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from shuffled.protocol import PartialKey

DATA_SUFFIX = ".arrow"
META_SUFFIX = ".json"


def partition_dir(root: Path, key: PartialKey) -> Path:
    return root / key.supervisor_task_id / key.interval.dirname / str(key.partition_id)


def data_path(root: Path, key: PartialKey, generation: int) -> Path:
    return partition_dir(root, key) / key.sub_task_id / f"{generation}{DATA_SUFFIX}"


def meta_path(data: Path) -> Path:
    return data.with_suffix(META_SUFFIX)


def generation_of(name: str) -> int | None:
    """``<generation>.arrow`` -> generation; None if the name is not a data file."""
    if not name.endswith(DATA_SUFFIX):
        return None
    stem = name[: -len(DATA_SUFFIX)]
    return int(stem) if stem.isdigit() else None


def write_json_atomic(path: Path, data: dict[str, object], fsync: bool) -> None:
    """Write ``data`` to ``path`` via a temp file and rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"))
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
