"""The manifest of one task's offload: its catalog rows and packs, as versioned JSON.

Written last (after every pack it names), so its presence in the tier means the task's
offload completed; encrypted like the packs. It is what a daemon reading a lost peer's
prefix needs to serve the peer's data without the peer's catalog.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shuffled.storage.catalog import COLUMNS, Row
from shuffled.storage.deep.journal import Copied

MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"


def task_prefix(sup: str, instance: str) -> str:
    return f"{sup}/{instance}"


def pack_key(location: int, pack: int) -> str:
    return f"{location}.{pack}"


def pack_object(sup: str, instance: str, location: int, pack: int) -> str:
    return f"{task_prefix(sup, instance)}/packs/{pack_key(location, pack)}.pack"


def manifest_object(sup: str, instance: str) -> str:
    return f"{task_prefix(sup, instance)}/{MANIFEST_NAME}"


def build(*, sup: str, instance: str, subs: Sequence[str], packs: dict[str, Copied],
          rows: Sequence[tuple[int, Row]]) -> bytes:
    body: dict[str, Any] = {
        "version": MANIFEST_VERSION, "supervisorTaskId": sup, "instance": instance,
        "subTaskIds": sorted(subs),
        "packs": [{"key": k, "object": c.object, "size": c.size, "crc32c": c.crc}
                  for k, c in sorted(packs.items())],
        "columns": ["location", *COLUMNS],
        "rows": [[index, *row] for index, row in rows],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def parse(data: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(data)
    if body.get("version") != MANIFEST_VERSION:
        raise ValueError(f"deep-storage manifest version {body.get('version')!r}; this "
                         f"daemon reads version {MANIFEST_VERSION}")
    return body
