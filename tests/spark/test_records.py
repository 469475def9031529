"""The records phase 1, the driver and phase 2 exchange: one JSON line each, versioned."""

from __future__ import annotations

import json

import pytest

from shuffled.spark.records import (VERSION, Declined, Lost, Partial, RecordError, Segment,
                                    TaskStats, dump, load)

RECORDS = [
    Partial(task=3, server="http://a:1", replicas=("http://a:1", "http://b:2"), sub="p3-a9-f0",
            start=0, end=86_400_000, partition=1, rows=10, bytes=900, crc32c="0a0b0c0d"),
    TaskStats(partition=3, attempt=9, attempt_number=0, server="http://a:1",
              bad=({"file": "f.json", "line": 2, "message": "m", "raw": "x"},),
              multi_value=("tags",), rows_in=12, bytes_shuffled=900),
    Declined(reason="a lone CR in f.json"),
    Segment(start=0, end=86_400_000, partition=1, rows=7, rows_in=10, bytes=512, path="/s/x",
            attempt=4, fetch_ms=1.5, spill_files=2, spill_bytes=4096),
    Lost(start=0, end=86_400_000, partition=1, attempt=4, lost=("http://a:1",), why="gone"),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_survives_its_line(record: object) -> None:
    line = dump(record)  # type: ignore[arg-type]
    assert "\n" not in line and json.loads(line)["v"] == VERSION
    assert load(line) == record


def test_the_line_keeps_the_task_reports_names() -> None:
    body = json.loads(dump(RECORDS[1]))
    assert body["kind"] == "stats" and body["rowsIn"] == 12 and body["multiValue"] == ["tags"]


def test_another_version_or_kind_is_refused_by_name() -> None:
    body = json.loads(dump(RECORDS[0]))
    with pytest.raises(RecordError, match="version 2 .*one release"):
        load(json.dumps({**body, "v": 2}))
    with pytest.raises(RecordError, match="unknown phase record kind"):
        load(json.dumps({**body, "kind": "nope"}))
    with pytest.raises(RecordError, match="unknown field 'colour'"):
        load(json.dumps({**body, "colour": 1}))
    with pytest.raises(RecordError, match="not a phase record"):
        load("not json")
