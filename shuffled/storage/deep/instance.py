"""The daemon instance id the tier names a daemon's objects by, stable across restarts.

The heartbeat's ``instance`` changes with every process (it tells a driver that a daemon
restarted); the tier needs the opposite: the same name for the same locations, so a
restarted daemon finds what it offloaded and resumes. Kept in ``.shuffled/instance-id`` of
every location (the first one found wins: a location replaced keeps the name the others
remember).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

from shuffled.storage.ondisk.layout import meta_dir

INSTANCE_FILE = "instance-id"
_ID = re.compile(r"[0-9a-f]{32}")


def _read(root: Path) -> str | None:
    try:
        text = (meta_dir(root) / INSTANCE_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _ID.fullmatch(text) else None


def _write(root: Path, instance: str) -> None:
    path = meta_dir(root) / INSTANCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{INSTANCE_FILE}.tmp")
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(instance + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def instance_id(roots: Sequence[Path]) -> str:
    """The id the locations remember, or a new one; written where it is missing
    (blocking; locations that cannot be written are skipped)."""
    found = [_read(root) for root in roots]
    instance = next((i for i in found if i), None) or uuid.uuid4().hex
    for root, have in zip(roots, found, strict=True):
        if have != instance:
            try:
                _write(root, instance)
            except OSError:
                pass
    return instance
