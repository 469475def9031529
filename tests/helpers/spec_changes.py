"""The rollup tutorial's spec (examples/rollup-tutorial) with one value changed or deleted."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())


def with_change(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TUTORIAL)
    node = spec
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is _DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return spec


_DELETE = object()
