"""The manifest of one task's offload: its catalog rows, packs and slabs, as versioned JSON.

Written last (after every pack and slab it names), so its presence in the tier means the
task's offload completed; encrypted like the packs. It is what a daemon reading a lost
peer's prefix needs to serve the peer's data without the peer's catalog.

Version 1: the partials' rows and the packs. Version 2 adds ``slabs`` (docs/slab.md): per
slab of the sealed subtasks, its object, the file's size and CRC32C at the copy, and its
catalog row but the statistics (subtask, slab, attempt, key kind, rows, where its data
section is and that section's CRC32C, and its index section as stored, base64): what a
shard read needs. A task without slabs is still written as version 1, so a daemon of
before slabs serves its share; a reader refuses a version it does not know, naming it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from shuffled.storage.catalog import COLUMNS, Row
from shuffled.storage.deep.journal import Copied
from shuffled.storage.ondisk.layout import SLAB_SUFFIX, slab_file_name
from shuffled.storage.ondisk.slabrows import SlabRow

MANIFEST_VERSION = 2
READ_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.json"

#: A slab in a manifest: (location index, its catalog row, its copy in the tier).
SlabCopy = tuple[int, SlabRow, Copied]


def task_prefix(sup: str, instance: str) -> str:
    return f"{sup}/{instance}"


def pack_key(location: int, pack: int) -> str:
    return f"{location}.{pack}"


def pack_object(sup: str, instance: str, location: int, pack: int) -> str:
    return f"{task_prefix(sup, instance)}/packs/{pack_key(location, pack)}.pack"


def slab_key(location: int, sub: str, slab: int, attempt: int) -> str:
    """A slab's key in the journal and the manifest: ``<location>/<its file's name>``."""
    return f"{location}/{slab_file_name(sub, slab, attempt)}"


def slab_key_parts(key: str) -> tuple[int, str, int, int]:
    """:func:`slab_key` -> (location, sub, slab, attempt)."""
    location, _, name = key.partition("/")
    stem = name[: -len(SLAB_SUFFIX)]
    rest, _, attempt = stem.rpartition(".")
    sub, _, slab = rest.rpartition(".")
    return int(location), sub, int(slab), int(attempt)


def slab_object(sup: str, instance: str, key: str) -> str:
    location, _, name = key.partition("/")
    return f"{task_prefix(sup, instance)}/slabs/{location}.{name}"


def manifest_object(sup: str, instance: str) -> str:
    return f"{task_prefix(sup, instance)}/{MANIFEST_NAME}"


def build(*, sup: str, instance: str, subs: Sequence[str], packs: dict[str, Copied],
          rows: Sequence[tuple[int, Row]], slabs: Sequence[SlabCopy] = ()) -> bytes:
    body: dict[str, Any] = {
        "version": 2 if slabs else 1, "supervisorTaskId": sup, "instance": instance,
        "subTaskIds": sorted(subs),
        "packs": [{"key": k, "object": c.object, "size": c.size, "crc32c": c.crc}
                  for k, c in sorted(packs.items())],
        "columns": ["location", *COLUMNS],
        "rows": [[index, *row] for index, row in rows],
    }
    if slabs:
        body["slabs"] = [
            {"location": index, "object": c.object, "size": c.size, "crc32c": c.crc,
             "subTaskId": r.sub, "slabId": r.slab, "attempt": r.attempt, "kind": r.kind,
             "rows": r.rows, "dataAt": r.data_at, "dataLen": r.data_len,
             "dataCrc32c": r.crc, "created": r.created,
             "index": base64.b64encode(r.idx).decode("ascii")}
            for index, r, c in sorted(slabs, key=lambda s: (s[0], s[1].sub, s[1].slab,
                                                            s[1].attempt))]
    return json.dumps(body, separators=(",", ":")).encode()


def parse(data: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(data)
    if body.get("version") not in READ_VERSIONS:
        raise ValueError(f"deep-storage manifest version {body.get('version')!r}; this "
                         f"daemon reads versions {', '.join(map(str, READ_VERSIONS))}: "
                         "upgrade it to read what a newer daemon wrote")
    return body


def parse_slabs(body: dict[str, Any]) -> list[SlabCopy]:
    """The slabs of a parsed manifest (none in version 1); ValueError, KeyError or
    TypeError for one that does not hold together."""
    sup = str(body["supervisorTaskId"])
    out: list[SlabCopy] = []
    for s in body.get("slabs", []):
        row = SlabRow(sup, str(s["subTaskId"]), int(s["slabId"]), int(s["attempt"]),
                      int(s["kind"]), int(s["size"]), int(s["rows"]), int(s["dataAt"]),
                      int(s["dataLen"]), int(s["dataCrc32c"]), float(s["created"]),
                      base64.b64decode(s["index"], validate=True), b"")
        if row.data_at < 0 or row.data_len < 0 or row.data_at + row.data_len > row.size:
            raise ValueError(f"slab {row.sub}.{row.slab}.{row.attempt}: its data section "
                             f"[{row.data_at}, +{row.data_len}) is not inside its "
                             f"{row.size} bytes")
        out.append((int(s["location"]), row, Copied(str(s["object"]), int(s["size"]),
                                                    int(s["crc32c"]))))
    return out
