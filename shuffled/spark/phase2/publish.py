"""Publishing: move segments into place and swap in the new manifest atomically.

Layout under ``<output>/<dataSource>/``::

    manifest.json                       the published segment descriptors (temp + rename)
    task-report.json, reports/<id>.json the latest and every task report
    segments/<start>_<end>/<version>/<partitionNum>.parquet

A new version replaces (drops from the manifest, then deletes) every older segment whose
interval lies inside the new segments' intervals, unless ``appendToExisting``: then new
segments join the interval's current version with the next partition numbers. Publishers of
one dataSource are serialised by an exclusive lock on ``.lock``.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shuffled.protocol import Interval
from shuffled.spark.phase2.durable import fsync_dir, sync_files

MANIFEST = "manifest.json"


def write_json_atomic(path: str, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` via a fsynced temp file and a rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=2, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


@contextmanager
def datasource_lock(ds_dir: str) -> Iterator[None]:
    os.makedirs(ds_dir, exist_ok=True)
    with open(os.path.join(ds_dir, ".lock"), "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def read_manifest(ds_dir: str) -> dict[str, Any]:
    path = os.path.join(ds_dir, MANIFEST)
    if not os.path.exists(path):
        return {"segments": []}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _interval(seg: dict[str, Any]) -> Interval:
    return Interval.parse_druid(seg["interval"])


def publish(ds_dir: str, data_source: str, version: str, staged: list[dict[str, Any]],
            shard_spec: Any, append: bool) -> list[dict[str, Any]]:
    """Publish the staged segments; returns their descriptors as written to the manifest.

    ``staged`` items have start, end, partition, rows, bytes, path (the staged file);
    ``shard_spec(item, numbered_offset)`` builds each shardSpec.
    """
    with datasource_lock(ds_dir):
        manifest = read_manifest(ds_dir)
        old: list[dict[str, Any]] = list(manifest.get("segments", []))
        new_ivs = sorted({(s["start"], s["end"]) for s in staged})
        keep, dropped = [], []
        for seg in old:
            iv = _interval(seg)
            inside = any(s <= iv.start and iv.end <= e for s, e in new_ivs)
            (dropped if inside and not append else keep).append(seg)
        published = []
        for s in sorted(staged, key=lambda x: (x["start"], x["partition"])):
            iv = Interval(s["start"], s["end"])
            seg_version, offset = version, 0
            if append:
                same = [k for k in keep if k["interval"] == str(iv)]
                if same:
                    seg_version = max(k["version"] for k in same)
                    offset = 1 + max(k["partitionNum"] for k in same if k["version"] == seg_version)
            num = s["partition"] + offset
            rel = os.path.join("segments", iv.dirname, seg_version, f"{num}.parquet")
            final = os.path.join(ds_dir, rel)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(s["path"], final)
            published.append({
                "dataSource": data_source, "interval": str(iv), "version": seg_version,
                "partitionNum": num, "shardSpec": shard_spec(s, offset), "rows": s["rows"],
                "bytes": s["bytes"], "path": rel,
            })
        # The moves are durable before the manifest names them: one syncfs for them all
        # (a fsync per segment directory where there is none).
        moved = [os.path.join(ds_dir, p["path"]) for p in published]
        sync_files([], [ds_dir, *{os.path.dirname(m) for m in moved}])
        segments = sorted(keep + published,
                          key=lambda x: (_interval(x), x["version"], x["partitionNum"]))
        write_json_atomic(os.path.join(ds_dir, MANIFEST),
                          {"dataSource": data_source, "version": version, "segments": segments})
        for seg in dropped:
            _remove_quietly(os.path.join(ds_dir, seg["path"]))
        return published


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
        parent = os.path.dirname(path)
        while parent and not os.listdir(parent):
            os.rmdir(parent)
            if os.path.basename(parent) == "segments":
                break
            parent = os.path.dirname(parent)
    except OSError:
        pass
