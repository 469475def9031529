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
from shuffled.spark.fs import remote
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


def _plan(old: list[dict[str, Any]], data_source: str, version: str,
          staged: list[dict[str, Any]], shard_spec: Any, append: bool,
          ) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Where each staged segment goes: (staged path, its descriptor) pairs, the old segments
    kept and those the new version replaces."""
    new_ivs = sorted({(s["start"], s["end"]) for s in staged})
    keep, dropped = [], []
    for seg in old:
        iv = _interval(seg)
        inside = any(s <= iv.start and iv.end <= e for s, e in new_ivs)
        (dropped if inside and not append else keep).append(seg)
    moves = []
    for s in sorted(staged, key=lambda x: (x["start"], x["partition"])):
        iv = Interval(s["start"], s["end"])
        seg_version, offset = version, 0
        if append:
            same = [k for k in keep if k["interval"] == str(iv)]
            if same:
                seg_version = max(k["version"] for k in same)
                offset = 1 + max(k["partitionNum"] for k in same if k["version"] == seg_version)
        num = s["partition"] + offset
        rel = "/".join(("segments", iv.dirname, seg_version, f"{num}.parquet"))
        moves.append((s["path"], {
            "dataSource": data_source, "interval": str(iv), "version": seg_version,
            "partitionNum": num, "shardSpec": shard_spec(s, offset), "rows": s["rows"],
            "bytes": s["bytes"], "path": rel,
        }))
    return moves, keep, dropped


def _manifest(data_source: str, version: str, keep: list[dict[str, Any]],
              published: list[dict[str, Any]]) -> dict[str, Any]:
    segments = sorted(keep + published,
                      key=lambda x: (_interval(x), x["version"], x["partitionNum"]))
    return {"dataSource": data_source, "version": version, "segments": segments}


def publish(ds_dir: str, data_source: str, version: str, staged: list[dict[str, Any]],
            shard_spec: Any, append: bool) -> list[dict[str, Any]]:
    """Publish the staged segments; returns their descriptors as written to the manifest.

    ``staged`` items have start, end, partition, rows, bytes, path (the staged file);
    ``shard_spec(item, numbered_offset)`` builds each shardSpec. ``ds_dir`` may be an
    ``s3://`` URI (:func:`publish_s3`).
    """
    if remote.scheme(ds_dir) == "s3":
        return publish_s3(ds_dir, data_source, version, staged, shard_spec, append)
    with datasource_lock(ds_dir):
        manifest = read_manifest(ds_dir)
        moves, keep, dropped = _plan(list(manifest.get("segments", [])), data_source,
                                     version, staged, shard_spec, append)
        for source, desc in moves:
            final = os.path.join(ds_dir, desc["path"])
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(source, final)
        published = [desc for _, desc in moves]
        # The moves are durable before the manifest names them: one syncfs for them all
        # (a fsync per segment directory where there is none).
        moved = [os.path.join(ds_dir, p["path"]) for p in published]
        sync_files([], [ds_dir, *{os.path.dirname(m) for m in moved}])
        write_json_atomic(os.path.join(ds_dir, MANIFEST),
                          _manifest(data_source, version, keep, published))
        for seg in dropped:
            _remove_quietly(os.path.join(ds_dir, seg["path"]))
        return published


def publish_s3(base: str, data_source: str, version: str, staged: list[dict[str, Any]],
               shard_spec: Any, append: bool) -> list[dict[str, Any]]:
    """Publish to ``s3://bucket/prefix/<dataSource>``: upload every segment, then PUT the
    manifest, the commit point (one object PUT is atomic for readers), then delete what
    the new version replaced. S3 has no rename and no lock: readers must go through the
    manifest (a segment object not in it is not published), and one publisher per
    dataSource at a time is the caller's to ensure; a failed run leaves uploaded segments
    no manifest names, which the next run of the same version overwrites."""
    manifest_uri = f"{base.rstrip('/')}/{MANIFEST}"
    current = remote.read_bytes(manifest_uri)
    old = json.loads(current)["segments"] if current else []
    moves, keep, dropped = _plan(old, data_source, version, staged, shard_spec, append)
    for source, desc in moves:
        remote.upload(source, f"{base.rstrip('/')}/{desc['path']}")
        os.remove(source)
    published = [desc for _, desc in moves]
    body = json.dumps(_manifest(data_source, version, keep, published), indent=2) + "\n"
    remote.write_bytes(manifest_uri, body.encode())
    for seg in dropped:
        remote.delete(f"{base.rstrip('/')}/{seg['path']}")
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
