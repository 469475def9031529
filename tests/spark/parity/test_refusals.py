"""Combinations Druid refuses, and values whose meaning we do not reproduce, are refused
before anything runs, naming the JSON path; never silently accepted (issue 35).

Each expectation comes from Druid's documentation or source, cited per test; none is taken
from this pipeline's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuffled.spark import SpecError, parse_spec
from tests.helpers.spec_changes import with_change

HASHED = {"type": "index_parallel", "forceGuaranteedRollup": True,
          "partitionsSpec": {"type": "hashed", "numShards": 2}}


def test_append_with_perfect_rollup_is_refused_with_druids_reason() -> None:
    # https://druid.apache.org/docs/latest/ingestion/native-batch#tuningconfig
    # (forceGuaranteedRollup: "... appendToExisting of ioConfig must be set to false")
    # and Druid's check in ParallelIndexSupervisorTask / IndexTask.isGuaranteedRollup:
    # "Perfect rollup cannot be guaranteed when appending to existing dataSources".
    spec = with_change("spec.tuningConfig", HASHED)
    spec["spec"]["ioConfig"]["appendToExisting"] = True
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.path == "$.spec.ioConfig.appendToExisting"
    assert "Perfect rollup cannot be guaranteed when appending to existing dataSources" in str(info.value)


def test_append_with_dynamic_partitioning_is_accepted() -> None:
    # Druid appends with dynamic partitioning (best-effort rollup):
    # https://druid.apache.org/docs/latest/ingestion/native-batch#ioconfig (appendToExisting)
    spec = with_change("spec.ioConfig.appendToExisting", True)
    assert parse_spec(spec).append_to_existing


def test_murmur3_32_abs_is_refused_not_substituted() -> None:
    # https://druid.apache.org/docs/latest/ingestion/native-batch#hash-based-partitioning:
    # partitionFunction murmur3_32_abs hashes Druid's serialized group key with Guava's
    # murmur3_32; this pipeline partitions with Spark's hash(), another function: asking
    # for Druid's by name must not silently give ours.
    spec = with_change("spec.tuningConfig", {**HASHED, "partitionsSpec": {
        "type": "hashed", "numShards": 2, "partitionFunction": "murmur3_32_abs"}})
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.path == "$.spec.tuningConfig.partitionsSpec.partitionFunction"
    assert "spark_murmur3_32" in str(info.value)


def test_hll_without_string_encoding_is_refused_not_hashed_otherwise() -> None:
    # https://druid.apache.org/docs/latest/development/extensions-core/datasketches-hll:
    # stringEncoding defaults to UTF16LE. This pipeline hashes UTF-8 only (the datasketches
    # package hashes a string's UTF-8 bytes), so leaving it out must not quietly give sketches
    # that do not union with Druid's: the spec must say UTF8.
    pytest.importorskip("datasketches")
    spec = with_change("spec.dataSchema.metricsSpec", [
        {"type": "HLLSketchBuild", "name": "ips", "fieldName": "srcIP"}])
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.path == "$.spec.dataSchema.metricsSpec[0].stringEncoding"
    assert "UTF16LE" in str(info.value) and "UTF8" in str(info.value)
    spec["spec"]["dataSchema"]["metricsSpec"][0]["stringEncoding"] = "UTF8"
    assert parse_spec(spec).metrics[0].type == "HLLSketchBuild"


def test_refusals_come_before_anything_runs(tmp_path: Path) -> None:
    # The refusal is the parser's: no daemon is asked (none listens at this address), no
    # Spark session starts, no output is written.
    from shuffled.spark import run_ingestion

    spec = with_change("spec.tuningConfig", HASHED)
    spec["spec"]["ioConfig"]["appendToExisting"] = True
    out = tmp_path / "out"
    with pytest.raises(SpecError, match="Perfect rollup cannot be guaranteed"):
        run_ingestion(spec, shuffle_servers=["http://127.0.0.1:9"], output_dir=str(out))
    assert not out.exists()
