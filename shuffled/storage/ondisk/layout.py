"""Where things live in a location (storage format 5: packs with their commit records,
schemas kept once; slabs).

```
<location>/.lock                      exclusive lock of the daemon using it
<location>/.tmp/                      scratch (health probes)
<location>/.shuffled/format           the format mark: "shuffled-storage 5"
<location>/.shuffled/catalog.sqlite   the index of every partial segment held here
<location>/.shuffled/commit.key       the key commit records are signed with
<location>/<supervisorTaskId>/<n>.pack  partial segments of that task, appended back to back
<location>/<supervisorTaskId>/<sub>.<slab>.<attempt>.slab  one slab (docs/slab.md), whole
```

A pack holds schema messages and partial segments' bodies (their dictionary and record
batch messages) back to back, at offsets the catalog records: each upload is an Arrow IPC
stream, stored as its schema message (once per pack and schema), its body, and no
end-of-stream marker, so that the bodies of a partition's partials written together are
one contiguous range (one ``sendfile``). After the partials each group commit made durable
comes a commit record naming them (:mod:`shuffled.storage.ondisk.commits`): the pack is the
truth, and a catalog that lags it is brought up to date at start. A replaced partial's old bytes stay in its pack
(readers holding them keep a consistent view) until the task is deleted, which removes the
task's directory.

Older formats are refused at start with a message naming ``shuffled migrate``, which
converts them in place (:mod:`shuffled.storage.lifecycle.migrate`): format 4 by making
the commit key (its packs have no records, and need none: their catalog was synced at every
commit), format 3 by adding the catalog's slabs table, format 2 (0.1.0: each partial a
whole stream in its pack) by rewriting the catalog only, format 1 (one ``.arrow`` file +
``.json`` sidecar per partial under ``<sup>/<interval>/<partition>/<sub>/``) by copying.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

FORMAT_VERSION = 5
FORMAT_TEXT = f"shuffled-storage {FORMAT_VERSION}\n"
META_DIR = ".shuffled"
FORMAT_NAME = "format"
CATALOG_NAME = "catalog.sqlite"
PACK_SUFFIX = ".pack"
#: Names at a location's top level that are not supervisor tasks.
RESERVED = frozenset({".lock", ".tmp", META_DIR})


def meta_dir(root: Path) -> Path:
    return root / META_DIR


def format_path(root: Path) -> Path:
    return root / META_DIR / FORMAT_NAME


def catalog_path(root: Path) -> Path:
    return root / META_DIR / CATALOG_NAME


def task_dir(root: Path, supervisor_task_id: str) -> Path:
    return root / supervisor_task_id


def pack_path(root: Path, supervisor_task_id: str, pack: int) -> Path:
    return root / supervisor_task_id / f"{pack}{PACK_SUFFIX}"


SLAB_SUFFIX = ".slab"


def slab_file_name(sub: str, slab: int, attempt: int) -> str:
    """``<sub>.<slabId>.<attempt>.slab``: one slab, whole (docs/slab.md)."""
    return f"{sub}.{slab}.{attempt}{SLAB_SUFFIX}"


def slab_path(root: Path, supervisor_task_id: str, sub: str, slab: int, attempt: int) -> Path:
    return root / supervisor_task_id / slab_file_name(sub, slab, attempt)


def pack_number(name: str) -> int | None:
    """``<n>.pack`` -> n; None if the name is not a pack."""
    if not name.endswith(PACK_SUFFIX):
        return None
    stem = name[: -len(PACK_SUFFIX)]
    return int(stem) if stem.isdigit() else None


def read_format(root: Path) -> int | None:
    """The location's format version, or None when it has no mark."""
    try:
        text = format_path(root).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    name, _, version = text.strip().partition(" ")
    if name != "shuffled-storage" or not version.isdigit():
        raise ValueError(f"{format_path(root)} is not a shuffled format mark: {text[:64]!r}")
    return int(version)


def write_meta(root: Path, name: str, data: bytes, fsync: bool, mode: int = 0o644) -> None:
    """Write ``<root>/.shuffled/<name>`` whole or not at all: a temporary file renamed over
    it, synced with the directory when ``fsync``."""
    meta_dir(root).mkdir(exist_ok=True)
    path = meta_dir(root) / name
    tmp = path.with_suffix(".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(tmp, flags, mode), "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(meta_dir(root))


def write_format(root: Path, fsync: bool) -> None:
    """Mark ``root`` as holding format :data:`FORMAT_VERSION` (atomically)."""
    write_meta(root, FORMAT_NAME, FORMAT_TEXT.encode(), fsync)
    if fsync:
        fsync_dir(root)


def user_entries(root: Path) -> list[str]:
    """Top-level names that are not ours to ignore (tasks, or another format's data)."""
    return sorted(n for n in os.listdir(root) if n not in RESERVED)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(directory: Path, name: str, body: object, fsync: bool) -> None:
    """Write ``body`` as JSON to ``directory/name``, all or nothing: a temporary file of a
    unique name (leading dot: readers skip and remove leftovers) renamed over it, synced
    with its directory when ``fsync``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    tmp = path.with_name(f".{name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(body, fh)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(directory)
