"""Every field the parser keeps is used by the pipeline, and every supported value in
docs/spec-coverage.md reaches the parsed spec (issue 35: ``skipHeaderRows`` was parsed, kept
and never used).

Two checks, each cheap enough to cover every field:
- each field of the parsed model (IngestSpec and the objects it holds) is read somewhere in
  shuffled/ outside the parser (shuffled/spark/spec/), so a value kept but never used fails
  here;
- each ``supported`` coverage row whose value is not the field's default changes the parsed
  spec (against the same spec without the field), so a value the parser drops fails here.
Behaviour per field is tested where the field acts (tests/spark/..., tests/spark/parity/).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from shuffled.spark import parse_spec
from shuffled.spark.spec import model
from shuffled.spark.spec.coverage import ANY, COVERAGE, Field
from tests.spark.spec.test_spec_coverage import BASE, _probe

ROOT = Path(__file__).resolve().parents[3]
USERS = [p for p in (ROOT / "shuffled").rglob("*.py") if "spark/spec" not in p.as_posix()]
SOURCE = "\n".join(p.read_text() for p in USERS)
MODELS = [model.IngestSpec, model.InputFormat, model.InputSource, model.PartitionsSpec,
          model.TimestampSpec, model.Dimension, model.Metric]
#: Fields only the parser and the model use, with why that is right.
NOT_READ_OUTSIDE: dict[str, str] = {
    "raw": "the spec as given, kept for reports (not a setting)",
    "force_guaranteed_rollup": "every run is a perfect rollup; the parser refuses the "
                               "combinations Druid refuses with it (spec.ioconfig.check_consistency)",
}


@pytest.mark.parametrize("name", sorted({f.name for m in MODELS for f in dataclasses.fields(m)}))
def test_each_parsed_field_is_read_by_the_pipeline(name: str) -> None:
    if name in NOT_READ_OUTSIDE:
        return
    assert re.search(rf"\.{name}\b", SOURCE), (
        f"{name} is parsed and kept but nothing outside shuffled/spark/spec reads it")


# Supported rows whose value is the field's default (parsing it changes nothing) or whose
# field is ours for the run, not the parsed spec (an ``id``).
_DEFAULTS = {
    ("type", '"index_parallel"'), ("spec.ioConfig.type", '"index_parallel"'),
    ("spec.tuningConfig.type", '"index_parallel"'),
    ("spec.dataSchema.granularitySpec.type", '"uniform"'),
    ("spec.dataSchema.transformSpec.transforms[].type", '"expression"'),
    ("spec.tuningConfig.shuffleRetrySeconds", "30"),
    ("spec.dataSchema.timestampSpec.format", '"auto"'),
    ("spec.dataSchema.dimensionsSpec.dimensions[].type", '"string"'),
    ("spec.dataSchema.dimensionsSpec.dimensions[].multiValueHandling", '"SORTED_ARRAY"'),
    ("spec.dataSchema.metricsSpec[].tgtHllType", '"HLL_4"'),
    ("spec.tuningConfig.partitionsSpec.type", '"dynamic"'),
    ("spec.tuningConfig.partialCompression", '"lz4"'),
    ("spec.tuningConfig.shuffleDurability", '"local"'),
    ("spec.tuningConfig.indexSpec.dimensionCompression", '"lz4"'),
    ("spec.tuningConfig.indexSpec.metricCompression", '"lz4"'),
    ("spec.ioConfig.inputSource.type", '"local"'),
    ("spec.ioConfig.inputFormat.type", '"json"'),
    ("spec.ioConfig.inputFormat.flattenSpec.fields[].type", '"root"'),
}


def _without(spec: dict[str, Any], path: str) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    node: Any = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key[:-2]][0] if key.endswith("[]") else node[key]
    node.pop(keys[-1], None)
    return out


def _rows() -> list[Field]:
    return [r for r in COVERAGE if r.status == "supported" and r.value != ANY
            and (r.path, json.dumps(r.value)) not in _DEFAULTS]


@pytest.mark.parametrize("row", _rows(), ids=[f"{r.path}={r.cell()}" for r in _rows()])
def test_each_supported_value_reaches_the_parsed_spec(row: Field) -> None:
    probe = _probe(row)
    if "Sketch" in json.dumps(probe) and importlib.util.find_spec("datasketches") is None:
        pytest.skip("sketch metrics need the datasketches package")
    given = parse_spec(probe)
    try:
        without = parse_spec(_without(probe, row.path))
    except Exception:  # the field is required where it is: it is used by construction
        return
    assert given != without or given.task_id != without.task_id, (
        f"{row.path} = {row.cell()} parses to the same spec as leaving it out")
