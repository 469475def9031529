"""A value that is not a number in a numeric column: Druid ingests the row with that value
null and counts it ``processedWithError`` (not ``unparseable``); ``maxParseExceptions``
counts both kinds; both phase-1 readers agree.

Expected values from Druid's documentation, not from this pipeline:
- https://druid.apache.org/docs/latest/ingestion/tasks#task-reports (rowStats:
  "processed: Number of rows successfully ingested without parsing errors";
  "processedWithError: Number of rows that were ingested, but contained a parsing error
  within one or more columns ... such as passing in a non-numeric String value for a
  numeric column"; "unparseable: ... could not be parsed at all and were discarded").
- https://druid.apache.org/docs/latest/ingestion/native-batch#tuningconfig
  (maxParseExceptions: "The maximum number of parse exceptions that can occur before the
  task halts ingestion and fails"; Druid's ParseExceptionHandler counts unparseable plus
  processedWithError against it).
- https://druid.apache.org/docs/latest/querying/sql-data-types#null-values (SQL-compatible
  null handling: the unparsed value is null, and a sum skips it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shuffled.spark.driver.job import IngestionFailed
from tests.helpers.ingestion import daemons, spark  # noqa: F401  (fixtures)
from tests.helpers.parity import READERS, ordered, run, spec_for

pytestmark = pytest.mark.spark

CSV = ("ts,origin,arr_delay,distance\n"
       "2013-01-01T05:00:00Z,EWR,5,1400\n"
       "2013-01-01T06:00:00Z,EWR,NA,1065\n"
       "2013-01-01T07:00:00Z,JFK,-3,944\n"
       "not a time,JFK,1,1\n")

METRICS = [{"type": "count", "name": "count"},
           {"type": "longSum", "name": "arr_delay", "fieldName": "arr_delay"},
           {"type": "longSum", "name": "distance", "fieldName": "distance"}]


def _spec(base: Path, **tuning: Any) -> dict[str, Any]:
    return spec_for(base, {"type": "csv", "findColumnsFromHeader": True},
                    dimensions=["origin"], metrics=METRICS, filter_="*.csv", **tuning)


@pytest.mark.parametrize("reader", READERS)
def test_non_numeric_metric_value_is_ingested_as_null_and_counted_with_error(
        spark: Any, daemons: list[Any], tmp_path: Path, reader: str) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "flights.csv").write_text(CSV)
    rows, stats, events, _ = run(_spec(tmp_path / "in"), [daemons[0].url], tmp_path / "out", reader)
    # The "NA" row is ingested: EWR counts 2 rows, its distance 1400 + 1065, its delay 5.
    assert rows == ordered([
        {"__time": "2013-01-01T00:00:00Z", "origin": "EWR", "count": 2, "arr_delay": 5, "distance": 2465},
        {"__time": "2013-01-01T00:00:00Z", "origin": "JFK", "count": 1, "arr_delay": -3, "distance": 944},
    ])
    assert (stats["processed"], stats["processedWithError"], stats["unparseable"],
            stats["thrownAway"]) == (2, 1, 1, 0)
    kinds = sorted((e["errorType"], e["line"]) for e in events)
    assert kinds == [("processedWithError", 3), ("unparseable", 5)]
    erred = next(e for e in events if e["errorType"] == "processedWithError")
    assert "arr_delay" in erred["message"] and "NA" in erred["message"]


def test_max_parse_exceptions_counts_rows_processed_with_error(
        spark: Any, daemons: list[Any], tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "flights.csv").write_text(CSV.replace("not a time,JFK,1,1\n", ""))
    # One parse exception (the NA row, ingested with an error): 1 allowed passes, 0 fails.
    rows, stats, _, _ = run(_spec(tmp_path / "in", maxParseExceptions=1), [daemons[0].url],
                            tmp_path / "ok", "native")
    assert stats["processedWithError"] == 1 and sum(r["count"] for r in rows) == 3
    with pytest.raises(IngestionFailed, match=r"Max parse exceptions \[0\] exceeded"):
        run(_spec(tmp_path / "in", maxParseExceptions=0), [daemons[0].url], tmp_path / "no", "native")


def test_log_parse_exceptions_logs_each_exception_only_when_asked(
        spark: Any, daemons: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # logParseExceptions (default false): "If true, log an error message when a parsing
    # exception occurs, containing information about the row where the error occurred."
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "flights.csv").write_text(CSV)
    with caplog.at_level("INFO"):
        run(_spec(tmp_path / "in"), [daemons[0].url], tmp_path / "quiet", "native")
    assert not [r for r in caplog.records if "parse exception" in r.getMessage()]
    caplog.clear()
    with caplog.at_level("INFO"):
        run(_spec(tmp_path / "in", logParseExceptions=True), [daemons[0].url], tmp_path / "loud", "native")
    logged = [r.getMessage() for r in caplog.records if "parse exception" in r.getMessage()]
    assert len(logged) == 2 and any("processedWithError" in m and "arr_delay" in m for m in logged)
