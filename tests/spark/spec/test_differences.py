"""docs/differences-from-druid.md == spec.differences.DIFFERENCES, and every refusal a row
names is what the parser does."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest

from shuffled.spark import SpecError, parse_spec
from shuffled.spark.phase2.shards import HASH_FUNCTION as WRITTEN
from shuffled.spark.spec.differences import DIFFERENCES, HASH_FUNCTION, table
from tests.helpers.spec_changes import TUTORIAL

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs/differences-from-druid.md"


def test_page_lists_exactly_the_table() -> None:
    m = re.search(r"<!-- differences:start.*?-->\n(.*?)\n<!-- differences:end -->", PAGE.read_text(), re.S)
    assert m, "docs/differences-from-druid.md lacks the differences:start/end markers"
    assert m.group(1).strip() == table(), "regenerate with: python -m shuffled.spark.spec.differences"


def test_the_page_names_the_hash_function_the_shardspecs_say() -> None:
    assert WRITTEN == HASH_FUNCTION and HASH_FUNCTION in PAGE.read_text()


def test_the_issue_35_topics_are_all_listed() -> None:
    topics = " ".join(d.topic.lower() for d in DIFFERENCES)
    for topic in ("hash", "encoding", "output format", "null handling"):
        assert topic in topics, topic


# Each refused path, as a spec change that makes the parser decide over it.
_PROBES = {
    "spec.tuningConfig.partitionsSpec.partitionFunction": {"tuningConfig": {
        "type": "index_parallel", "forceGuaranteedRollup": True,
        "partitionsSpec": {"type": "hashed", "numShards": 2, "partitionFunction": "murmur3_32_abs"}}},
    "spec.dataSchema.metricsSpec[].stringEncoding": {"metricsSpec": [
        {"type": "HLLSketchBuild", "name": "m", "fieldName": "srcIP"}]},
}


@pytest.mark.parametrize("row", [d for d in DIFFERENCES if d.refused_at], ids=lambda d: d.topic)
def test_each_refusal_named_is_the_parsers(row: object) -> None:
    path = row.refused_at  # type: ignore[attr-defined]
    change = _PROBES[path]
    if "HLL" in json.dumps(change) and importlib.util.find_spec("datasketches") is None:
        pytest.skip("sketch metrics need the datasketches package")
    spec = copy.deepcopy(TUTORIAL)
    for key, value in change.items():
        target = spec["spec"] if key == "tuningConfig" else spec["spec"]["dataSchema"]
        target[key] = value
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.path == "$." + path.replace("[]", "[0]")
