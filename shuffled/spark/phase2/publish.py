"""Publishing: swap in the new manifest atomically; the segments are already in place.

Layout under ``<output>/<dataSource>/``::

    manifest.json                       the published segment descriptors (temp + rename)
    task-report.json, reports/<id>.json the latest and every task report
    segments/<version>/<start>_<end>_<partition>.a<attempt>.parquet   (since 0.2)
    segments/<start>_<end>/<version>/<partitionNum>.parquet            (0.1, still read)

Merge tasks write each segment straight to its final place, under a directory of its own
ingestion's version and a name of its own task attempt, and sync it before the task ends;
so publishing is writing the manifest, the commit point, not thousands of renames (a file
creation or rename costs 0.05-1 ms of kernel time each on this machine's ext4, and a
Druid-shaped job has thousands of segments). A file no manifest names is not published:
files of attempts that did not commit are removed once the manifest lands, and a failed
ingestion's version directory is removed whole. Readers must go through the manifest.

A new version replaces (drops from the manifest, then deletes) every older segment whose
interval lies inside the new segments' intervals, unless ``appendToExisting``: then new
segments join the interval's current version with the next partition numbers (the
descriptor says so; the file stays where it was written). Publishers of one dataSource are
serialised by an exclusive lock on ``.lock``.
"""

from __future__ import annotations

import array
import bisect
import itertools

import fcntl
import functools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shuffled.protocol import Interval
from shuffled.spark.fs import remote
from shuffled.spark.phase2.durable import fsync_dir
from shuffled.spark.records import Segment

MANIFEST = "manifest.json"


def write_json_atomic(path: str, value: Any) -> None:
    """Write ``value`` as indented JSON to ``path`` (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(value, indent=2) + "\n")


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a fsynced temp file and a rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
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
    return _parse_interval(seg["interval"])


@functools.lru_cache(maxsize=1 << 16)
def _parse_interval(text: str) -> Interval:
    """A segment's interval text parsed once: a day's shards share it, and a rerun's old
    segments name the new ones' days again (the manifest's sort and :func:`plan_moves`)."""
    return Interval.parse_druid(text)


def segment_dir(root: str, version: str) -> str:
    """The directory the merge tasks of the ingestion of ``version`` write into."""
    return os.path.join(root, "segments", version)


#: ``FS_TOPDIR_FL`` (linux/fs.h; ``chattr +T``): "the top of directory hierarchies for
#: the purposes of the Orlov block allocator".
FS_TOPDIR_FL = 0x00020000
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602


def spread_versions(root: str) -> bool:
    """Mark ``root`` (an existing folder: the one holding the version folders) the top of
    a directory hierarchy where the file system has that attribute (ext2/3/4); whether it
    is marked. Best effort: elsewhere nothing changes.

    Why: ext4 without a journal does not reuse an inode freed in the last minute, and each
    create skips the recently freed ones of its block group one by one. A rerun's segments
    used to be created in the same group as the previous version's, which its publish had
    just removed: 1.2-2.0 s of ``openat`` per phase-2 worker on the bench's 7,304
    segments (docs/benchmarks.md). With ``root`` marked, the Orlov allocator places each
    new version folder, and the files in it, in a block group of its own: about 1 s less
    of phase 2 there. Journaled ext4 and other file systems lose nothing by it."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        if not flags[0] & FS_TOPDIR_FL:
            flags[0] |= FS_TOPDIR_FL
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
        return True
    except OSError:  # no such attribute here (ENOTTY, EOPNOTSUPP), or not ours to set
        return False
    finally:
        os.close(fd)


def make_durable_dir(path: str) -> None:
    """``mkdir -p path``, each directory it created durable in its parent (before phase 2
    writes segments there: a segment synced by its task must not be lost with its folder)."""
    missing = []
    at = os.path.abspath(path)
    while not os.path.isdir(at):
        missing.append(at)
        at = os.path.dirname(at)
    os.makedirs(path, exist_ok=True)
    for made in reversed(missing):
        fsync_dir(os.path.dirname(made))


def segment_name(start: int, end: int, partition: int, attempt: int) -> str:
    """A merge task attempt's file of one partition (unique per attempt: two attempts never
    write the same file, so a zombie attempt cannot damage a published segment)."""
    return f"{Interval(start, end).dirname}_{partition}.a{attempt}.parquet"


def plan_moves(old: list[dict[str, Any]], data_source: str, version: str,
          staged: list[Segment], shard_spec: Any, append: bool, root: str,
          ) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Each written segment's (local path, descriptor) pair, the old segments kept and those
    the new version replaces. ``root``: the local directory the paths are relative to."""
    new_ivs = sorted({(s.start, s.end) for s in staged})
    starts = [s for s, _ in new_ivs]
    # The latest end among the new intervals starting at or before each one: an old
    # segment lies inside a new interval iff the one found by bisection reaches its end
    # (a scan of every new interval per old segment was quadratic: 7,304 x 3,652 on a
    # rerun of comparison 7).
    reach = list(itertools.accumulate((e for _, e in new_ivs), max))
    keep: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for seg in old:
        iv = _interval(seg)
        at = bisect.bisect_right(starts, iv.start) - 1
        inside = at >= 0 and reach[at] >= iv.end
        (dropped if inside and not append else keep).append(seg)
    kept_at: dict[str, list[dict[str, Any]]] = {}
    for k in keep:
        kept_at.setdefault(k["interval"], []).append(k)
    moves = []
    under = os.path.join(os.path.normpath(root), "")
    for s in sorted(staged, key=lambda x: (x.start, x.partition)):
        iv = Interval(s.start, s.end)
        seg_version, offset = version, 0
        if append:
            same = kept_at.get(str(iv), [])
            if same:
                seg_version = max(k["version"] for k in same)
                offset = 1 + max(k["partitionNum"] for k in same if k["version"] == seg_version)
        num = s.partition + offset
        # A prefix cut where the path lies under root (as every segment's does): relpath
        # normalises both paths each call, ~15 us a segment.
        rel = (s.path[len(under):] if s.path.startswith(under)
               else os.path.relpath(s.path, root)).replace(os.sep, "/")
        moves.append((s.path, {
            "dataSource": data_source, "interval": str(iv), "version": seg_version,
            "partitionNum": num, "shardSpec": shard_spec(s, offset), "rows": s.rows,
            "bytes": s.bytes, "path": rel,
        }))
    return moves, keep, dropped


def describe(data_source: str, version: str, staged: list[Segment], shard_spec: Any,
             root: str) -> list[tuple[str, dict[str, Any]]]:
    """Each written segment's (local path, descriptor) as a first publication numbers them
    (the Iceberg publisher's report: the table, not a manifest, is what readers use)."""
    return plan_moves([], data_source, version, staged, shard_spec, False, root)[0]


def _manifest(data_source: str, version: str, keep: list[dict[str, Any]],
              published: list[dict[str, Any]]) -> dict[str, Any]:
    segments = sorted(keep + published,
                      key=lambda x: (_interval(x), x["version"], x["partitionNum"]))
    return {"dataSource": data_source, "version": version, "segments": segments}


def manifest_text(manifest: dict[str, Any]) -> str:
    """``manifest`` as JSON text, a field a line and a segment a line: one ``json.dumps``
    a segment goes through json's C encoder, where ``indent=2`` takes the pure-Python one
    (100 against 36 ms for comparison 7's 7,304 segments)."""
    fields = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in manifest.items()
              if k != "segments"]
    segments = manifest.get("segments", [])
    listed = ",\n".join(f"    {json.dumps(seg)}" for seg in segments)
    fields.append(f'  "segments": [\n{listed}\n  ]' if segments else '  "segments": []')
    return "{\n" + ",\n".join(fields) + "\n}\n"


def publish(ds_dir: str, data_source: str, version: str, staged: list[Segment],
            shard_spec: Any, append: bool, local_root: str | None = None,
            ) -> list[dict[str, Any]]:
    """Publish the written segments; returns their descriptors as written to the manifest.

    ``staged`` are the written segments (:class:`~shuffled.spark.records.Segment`: the path of
    each file, in place under ``local_root``: ``ds_dir`` itself for a local output, the local directory
    the segments were written to for an ``s3://`` one, :func:`publish_s3`). Every file is
    durable already (the merge tasks sync theirs). ``shard_spec(item, numbered_offset)``
    builds each shardSpec.
    """
    if remote.scheme(ds_dir) == "s3":
        return publish_s3(ds_dir, data_source, version, staged, shard_spec, append,
                          local_root or ds_dir)
    with datasource_lock(ds_dir):
        manifest = read_manifest(ds_dir)
        moves, keep, dropped = plan_moves(list(manifest.get("segments", [])), data_source,
                                     version, staged, shard_spec, append, local_root or ds_dir)
        published = [desc for _, desc in moves]
        write_text_atomic(os.path.join(ds_dir, MANIFEST),
                          manifest_text(_manifest(data_source, version, keep, published)))
        for seg in dropped:
            _remove_quietly(os.path.join(ds_dir, seg["path"]))
        remove_unpublished({source for source, _ in moves})
        return published


def remove_unpublished(published: set[str]) -> int:
    """Remove the files of attempts that did not commit from the directories the published
    ``published`` files are in (each an ingestion's own version directory); the count."""
    removed = 0
    for directory in {os.path.dirname(p) for p in published}:
        try:
            names = os.listdir(directory)
        except OSError:
            continue  # best effort, after the commit point: never fails the ingestion
        for name in names:
            path = os.path.join(directory, name)
            if path not in published and name.endswith(".parquet"):
                _remove_quietly(path)
                removed += 1
    return removed


def publish_s3(base: str, data_source: str, version: str, staged: list[Segment],
               shard_spec: Any, append: bool, local_root: str) -> list[dict[str, Any]]:
    """Publish to ``s3://bucket/prefix/<dataSource>``: upload every segment, then PUT the
    manifest, the commit point (one object PUT is atomic for readers), then delete what
    the new version replaced. S3 has no rename and no lock: readers must go through the
    manifest (a segment object not in it is not published), and one publisher per
    dataSource at a time is the caller's to ensure; a failed run leaves uploaded segments
    no manifest names, which the next run of the same version overwrites."""
    manifest_uri = f"{base.rstrip('/')}/{MANIFEST}"
    current = remote.read_bytes(manifest_uri)
    old = json.loads(current)["segments"] if current else []
    moves, keep, dropped = plan_moves(old, data_source, version, staged, shard_spec, append,
                                 local_root)
    for source, desc in moves:
        remote.upload(source, f"{base.rstrip('/')}/{desc['path']}")
        os.remove(source)
    published = [desc for _, desc in moves]
    body = manifest_text(_manifest(data_source, version, keep, published))
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
