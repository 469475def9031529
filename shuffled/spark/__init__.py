"""The PySpark two-phase perfect-rollup ingestion (Druid ``index_parallel`` specs).

Public API: :func:`run_ingestion`, :func:`parse_spec`, :class:`IngestSpec`,
:class:`IngestResult`, :class:`SpecError`, :class:`IngestionFailed`. Importing this package
does not import pyspark; :func:`run_ingestion` does, on first call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shuffled.spark.spec.model import IngestSpec
from shuffled.spark.spec.parse import SpecError, parse_spec

if TYPE_CHECKING:
    from shuffled.spark.driver.pipeline import IngestionFailed, IngestResult, run_ingestion

__all__ = ["IngestResult", "IngestSpec", "IngestionFailed", "SpecError", "parse_spec",
           "run_ingestion"]


def __getattr__(name: str) -> Any:
    if name in ("run_ingestion", "IngestResult", "IngestionFailed"):
        from shuffled.spark.driver import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
