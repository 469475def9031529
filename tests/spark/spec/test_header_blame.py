"""A misspelt field is named where it was misspelt (issue 39): with findColumnsFromHeader,
a dimension or metric naming a column the header lacks was blamed on
``$.spec.ioConfig.inputFormat.findColumnsFromHeader``. The message now names the spec
field, the column, a close match in the header and the header itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuffled.spark.phase1.native.text.plan import csv_columns
from shuffled.spark.spec.parse import SpecError, parse_spec
from tests.helpers.parity import spec_for


@pytest.mark.parametrize("dimensions, metrics, path, column", [
    (["carier"], [], "$.spec.dataSchema.dimensionsSpec.dimensions[0]", "carier"),
    (["carrier"], [{"type": "longSum", "name": "d", "fieldName": "distnce"}],
     "$.spec.dataSchema.metricsSpec[0]", "distnce"),
])
def test_the_field_that_names_a_missing_column_is_blamed(
        tmp_path: Path, dimensions: list[str], metrics: list[dict[str, str]], path: str,
        column: str) -> None:
    (tmp_path / "a.csv").write_text("ts,carrier,distance\n2013-01-01T05:00:00Z,UA,1400\n")
    spec = parse_spec(spec_for(tmp_path, {"type": "csv", "findColumnsFromHeader": True},
                               dimensions=dimensions, metrics=metrics))
    with pytest.raises(SpecError) as refused:
        csv_columns(spec, [str(tmp_path / "a.csv")])
    text = str(refused.value)
    assert path in text and "findColumnsFromHeader" not in text, text
    assert f"names column {column!r}" in text and "did you mean" in text, text
    assert "['ts', 'carrier', 'distance']" in text, text
