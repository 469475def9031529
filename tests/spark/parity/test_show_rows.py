"""``--show-rows`` shows the rows the ingestion just published, read through its manifest
(as every reader must: a file no manifest names is not published), never every Parquet file
under the output: not another dataSource's, not a leftover file, and from an object store
too. (Druid's equivalent is querying the dataSource: only published, visible segments
answer, https://druid.apache.org/docs/latest/design/storage#segment-lifecycle.)"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from shuffled.api import ingest
from tests.helpers.ingestion import daemons, spark  # noqa: F401  (fixtures)
from tests.helpers.parity import spec_for

pytestmark = pytest.mark.spark


def _spec(base: Path, name: str) -> dict[str, Any]:
    spec = spec_for(base, {"type": "csv", "findColumnsFromHeader": True},
                    dimensions=["origin"], metrics=[{"type": "count", "name": "count"}],
                    filter_="*.csv")
    spec["spec"]["dataSchema"]["dataSource"] = name
    return spec


def _shown(spec: dict[str, Any], url: str, output: str) -> list[str]:
    lines: list[str] = []
    ingest(spec, shuffle_servers=[url], output=output, show_rows=50, progress=lines.append)
    return [ln.strip() for ln in lines if ln.startswith("   ")]


def test_show_rows_reads_the_published_manifest_only(spark: Any, daemons: list[Any],
                                                     tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.csv").write_text("ts,origin\n2013-01-01T00:00:00Z,EWR\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.csv").write_text("ts,origin\n2013-01-01T00:00:00Z,JFK\n")
    out = tmp_path / "out"
    _shown(_spec(tmp_path / "a", "first"), daemons[0].url, str(out))
    # a Parquet file no manifest names (say, an attempt that never committed)
    seg = next((out / "first").rglob("*.parquet"))
    shutil.copy(seg, out / "first" / "stray.parquet")
    shown = _shown(_spec(tmp_path / "b", "second"), daemons[0].url, str(out))
    assert shown == ["__time=2013-01-01 00:00:00+00:00, origin=JFK, count=1"]


def test_show_rows_from_an_object_store(spark: Any, daemons: list[Any], tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    from tests.helpers.s3 import moto_s3

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.csv").write_text("ts,origin\n2013-01-01T00:00:00Z,LGA\n")
    with moto_s3() as (fs, _):
        fs.create_dir("shown-out")
        shown = _shown(_spec(tmp_path / "a", "third"), daemons[0].url, "s3://shown-out/segments")
    assert shown == ["__time=2013-01-01 00:00:00+00:00, origin=LGA, count=1"]
