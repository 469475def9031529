"""Publishing to an Apache Iceberg table (issue 26): real Spark in local mode, a real daemon,
real pyiceberg catalogs (SQLite, PostgreSQL started here on loopback) and warehouses (local,
moto's S3 server); every table read back through pyiceberg, the rows checked against the
documented tutorial rows and DuckDB's rollup of the input."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shuffled.protocol import parse_instant
from shuffled.spark import IngestionFailed, run_ingestion
from shuffled.spark.hooks import Hooks
from tests.helpers.ingestion import (  # noqa: F401  (fixtures)
    assert_matches,
    base_spec,
    expected_rollup,
    generate,
    spark,
    start_daemon,
    write_parts,
)

pyiceberg = pytest.importorskip("pyiceberg", reason="pyiceberg is in the spark extras")
pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    d = start_daemon(tmp_path_factory.mktemp("loc"))
    yield d
    d.stop()


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A SQL catalog named ``t`` on SQLite, configured the pyiceberg way (variables)."""
    monkeypatch.setenv("PYICEBERG_CATALOG__T__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__T__URI", f"sqlite:///{tmp_path}/catalog.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__T__WAREHOUSE", f"file://{tmp_path}/warehouse")
    (tmp_path / "warehouse").mkdir()
    from pyiceberg.catalog import load_catalog

    return load_catalog("t")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    base = tmp_path_factory.mktemp("input")
    lines, good, _ = generate(6000, seed=5)
    write_parts(lines, base / "json", parts=3)
    return base / "json", good


def _events(base: Path, **io: Any) -> dict[str, Any]:
    spec = base_spec(base, {"type": "hashed", "numShards": 2})
    spec["spec"]["ioConfig"].update(io)
    return spec


def _rows(table: Any, snapshot_id: int | None = None) -> pa.Table:
    return table.scan(snapshot_id=snapshot_id).to_arrow()


def _as_output(t: pa.Table) -> pa.Table:
    """pyiceberg's rows with ``__time`` in ms, as the checks of the directory output read."""
    return t.set_column(0, "__time", t.column("__time").cast(pa.timestamp("ms", tz="UTC")))


def test_tutorial_to_the_default_catalog_reads_back_its_five_rows(
        spark: Any, daemon: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SHUFFLED_ICEBERG_HOME", str(tmp_path / "ice"))
    spec = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())
    result = run_ingestion(spec, shuffle_servers=[daemon.url],
                           output_dir="iceberg://local/druid.rollup_tutorial")
    assert result.table == "iceberg://local/druid.rollup_tutorial"
    from shuffled.spark.phase2.iceberg import load_catalog

    table = load_catalog("local").load_table("druid.rollup_tutorial")
    assert table.location() == f"file://{tmp_path}/ice/warehouse/druid/rollup_tutorial"
    rows = table.scan().to_arrow().sort_by("__time").to_pylist()
    documented = json.loads((ROOT / "examples/rollup-tutorial/expected-rows.json").read_text())
    assert [{**r, "__time": int(r["__time"].timestamp() * 1000)} for r in rows] == [
        {**r, "__time": parse_instant(r["__time"])} for r in documented]
    snap = table.current_snapshot()
    assert snap.summary["shuffled.version"] == result.version
    assert snap.summary["shuffled.task-id"] == result.task_id
    assert [s["path"] for s in result.segments] == [
        f["file_path"] for f in table.inspect.files().to_pylist()]
    assert Path(result.report_path).is_file()
    assert len(table.spec().fields) == 0  # week segments: no Iceberg transform holds one
