"""Druid's parse-exception handling on the driver, once phase 1's subtasks have reported:
the saved exceptions (``maxSavedParseExceptions``, each located by file and line), logged
only when ``logParseExceptions`` asks, and ``maxParseExceptions`` checked against
``unparseable + processedWithError`` rows (Druid's ParseExceptionHandler counts both)."""

from __future__ import annotations

import logging
from typing import Any

from shuffled.spark.phase1.source import resolve_lines
from shuffled.spark.spec.model import IngestSpec

log = logging.getLogger("shuffled.spark")


def saved_exceptions(spec: IngestSpec, bad: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first ``maxSavedParseExceptions`` of the subtasks' saved rows, with their line
    numbers, each logged if ``logParseExceptions`` (Druid's default: not logged)."""
    saved = bad[: spec.max_saved_parse_exceptions]
    resolve_lines(saved)
    if spec.log_parse_exceptions:
        for b in saved:
            log.error("parse exception (%s) at %s:%s: %s", b.get("errorType", "unparseable"),
                      b["file"], b["line"], b["message"])
    return saved


def over_limit(spec: IngestSpec, rows: dict[str, int], saved: list[dict[str, Any]]) -> str | None:
    """Why the task fails, when its parse exceptions are more than ``maxParseExceptions``."""
    if rows["unparseable"] + rows["processedWithError"] <= spec.max_parse_exceptions:
        return None
    first = saved[0] if saved else {}
    where = f"; first at {first.get('file')}:{first.get('line')}: {first.get('message')}" if first else ""
    return (f"Max parse exceptions [{spec.max_parse_exceptions}] exceeded: "
            f"{rows['unparseable']} unparseable rows, {rows['processedWithError']} processed "
            f"with errors{where}")
