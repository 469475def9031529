"""docs/spec-coverage.md == spec.coverage.COVERAGE, and every row's status is what the parser does."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from shuffled.spark import SpecError, parse_spec
from shuffled.spark.spec.coverage import ANY, COVERAGE, Field, table

ROOT = Path(__file__).resolve().parents[3]
BASE = json.loads((ROOT / "tests/data/druid/transform/transform-index.json").read_text())
PAGE = ROOT / "docs/spec-coverage.md"


def _page_table() -> str:
    text = PAGE.read_text()
    m = re.search(r"<!-- coverage:start.*?-->\n(.*?)\n<!-- coverage:end -->", text, re.S)
    assert m, "docs/spec-coverage.md lacks the coverage:start/end markers"
    return m.group(1).strip()


def test_page_lists_exactly_the_parsers_table() -> None:
    assert _page_table() == table(), "regenerate with: python -m shuffled.spark.spec.coverage"


def _set(spec: dict[str, Any], path: str, value: Any, parent: dict[str, Any] | None = None) -> None:
    keys = path.split(".")
    node: Any = spec
    for i, key in enumerate(keys[:-1]):
        last = i == len(keys) - 2
        if key.endswith("[]"):
            items = node.setdefault(key[:-2], [{}])
            if last and parent is not None:
                items[0] = copy.deepcopy(parent)
            elif not isinstance(items[0], dict):
                items[0] = {"name": items[0]}
            node = items[0]
        else:
            if last and parent is not None:
                node[key] = copy.deepcopy(parent)
            node = node.setdefault(key, {})
    node[keys[-1]] = value


def _probe(row: Field) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    value = row.value
    if value == ANY:
        value = copy.deepcopy(_get(spec, row.path))
    _set(spec, row.path, value, row.parent)
    for path, v in row.extra.items():
        _set(spec, path, v)
    return spec


def _get(spec: dict[str, Any], path: str) -> Any:
    node: Any = spec
    for key in path.split("."):
        node = node[key[:-2]][0] if key.endswith("[]") else node[key]
    return node


@pytest.mark.parametrize("row", COVERAGE, ids=[f"{r.path}={r.cell()}" for r in COVERAGE])
def test_row_status_is_what_the_parser_does(row: Field) -> None:
    spec = _probe(row)
    metric = json.dumps(spec["spec"]["dataSchema"].get("metricsSpec", []))
    if "Sketch" in metric and importlib.util.find_spec("datasketches") is None:
        pytest.skip("sketch metrics need the datasketches package (the spark extra)")
    where = "$." + row.path.replace("[]", "[0]")
    if row.status == "refused":
        with pytest.raises(SpecError) as info:
            parse_spec(spec)
        assert info.value.path.startswith(where), info.value
    else:
        assert row.status in ("supported", "ignored")
        parse_spec(spec)


def test_every_field_path_is_unique_per_value() -> None:
    keys = [(r.path, json.dumps(r.value), json.dumps(r.extra, sort_keys=True)) for r in COVERAGE]
    assert len(keys) == len(set(keys))
