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
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest

from shuffled.protocol import parse_instant
from shuffled.spark import IngestionFailed, run_ingestion
from shuffled.spark.hooks import Hooks
from tests.helpers.ingestion import (  # noqa: F401  (fixtures)
    assert_matches,
    base_spec,
    expected_rollup,
    json_input,
    spark,
    start_daemon,
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
    from shuffled.spark.phase2.iceberg import load_catalog

    return load_catalog("t")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    return json_input(tmp_path_factory.mktemp("input"), 6000, seed=5, parts=3)


def _events(base: Path, **io: Any) -> dict[str, Any]:
    spec = base_spec(base, {"type": "hashed", "numShards": 2})
    spec["spec"]["ioConfig"].update(io)
    if io.get("appendToExisting"):
        # Druid refuses appending with perfect rollup: an append uses dynamic partitioning.
        spec["spec"]["tuningConfig"].update(forceGuaranteedRollup=False,
                                            partitionsSpec={"type": "dynamic"})
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
    from shuffled.api import ingest

    result = ingest(spec, shuffle_servers=[daemon.url],
                    output="iceberg://local/druid.rollup_tutorial")
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


def _files_under(table: Any) -> set[str]:
    """The Parquet files in the table's local data directory."""
    return {f"file://{p}" for p in (Path(table.location()[len("file://"):]) / "data")
            .rglob("*.parquet")}


def _referenced(table: Any) -> set[str]:
    """Every data file some snapshot references (time travel keeps the replaced ones)."""
    return {f["file_path"] for snap in table.snapshots()
            for f in table.inspect.files(snap.snapshot_id).to_pylist()}


def test_multi_day_equals_duckdb_and_a_rerun_leaves_one_version(
        spark: Any, daemon: Any, catalog: Any, dataset: Any, tmp_path: Path) -> None:
    base, good = dataset
    uri = "iceberg://t/druid.events"
    first = run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri)
    table = catalog.load_table("druid.events")
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("__time_day", "day")]
    assert_matches(_as_output(_rows(table)), expected_rollup(good))
    one = table.current_snapshot()
    assert one.summary["shuffled.version"] == first.version
    assert {f["file_path"] for f in table.inspect.files().to_pylist()} == {
        s["path"] for s in first.segments}
    assert all(s["path"].startswith(table.location() + "/data/") for s in first.segments)
    for f in table.inspect.files().to_pylist():  # what readers seek the footer by
        assert f["file_size_in_bytes"] == os.path.getsize(f["file_path"][len("file://"):])
        assert f["record_count"] == pa.parquet.read_metadata(f["file_path"][7:]).num_rows

    second = run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri)
    table = catalog.load_table("druid.events")
    snaps = table.snapshots()
    assert len(snaps) == 2 and snaps[1].summary.operation.value == "overwrite"
    assert snaps[1].summary["shuffled.version"] == second.version
    assert_matches(_as_output(_rows(table)), expected_rollup(good))  # one version, not two
    assert_matches(_as_output(_rows(table, one.snapshot_id)), expected_rollup(good))
    live = {f["file_path"] for f in table.inspect.files().to_pylist()}
    assert live == {s["path"] for s in second.segments}
    old = {f["file_path"] for f in table.inspect.files(one.snapshot_id).to_pylist()}
    assert old == {s["path"] for s in first.segments} and not old & live

    # appendToExisting: the rows join the table (every count doubled), one more snapshot.
    run_ingestion(_events(base, appendToExisting=True), shuffle_servers=[daemon.url],
                  output_dir=uri)
    table = catalog.load_table("druid.events")
    assert len(table.snapshots()) == 3
    assert table.current_snapshot().summary.operation.value == "append"
    assert _rows(table).num_rows == 2 * expected_rollup(good).num_rows
    # Attempts that did not commit left no file in the table's data directory.
    assert _files_under(table) == _referenced(table)


def test_schema_evolves_by_name_and_a_refused_run_commits_nothing(
        spark: Any, daemon: Any, catalog: Any, dataset: Any, tmp_path: Path) -> None:
    base, good = dataset
    uri = "iceberg://t/druid.evolving"
    spec = _events(base)
    spec["spec"]["dataSchema"]["dimensionsSpec"]["dimensions"] = ["country"]
    run_ingestion(spec, shuffle_servers=[daemon.url], output_dir=uri)
    table = catalog.load_table("druid.evolving")
    assert "device" not in table.schema().column_names

    run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri)  # + device
    table = catalog.load_table("druid.evolving")
    assert table.schema().find_field("device").field_type == pyiceberg.types.StringType()
    assert_matches(_as_output(_rows(table)), expected_rollup(good))
    before = [s.snapshot_id for s in table.snapshots()]

    changed = _events(base)
    changed["spec"]["dataSchema"]["metricsSpec"][1] = {
        "type": "doubleSum", "name": "clicks", "fieldName": "clicks"}
    with pytest.raises(Exception, match="column 'clicks'") as failed:
        run_ingestion(changed, shuffle_servers=[daemon.url], output_dir=uri)
    assert "long" in str(failed.value) and "double" in str(failed.value)
    table = catalog.load_table("druid.evolving")
    assert [s.snapshot_id for s in table.snapshots()] == before
    assert _files_under(table) == _referenced(table)


class CommitInBetween(Hooks):
    """Before the first commit attempt of the ingestion it is given to, run a whole other
    ingestion (``spec``, appending) into the same table: that one commits first, so the
    first one's commit conflicts, and must be re-planned, not lost."""

    def __init__(self, spec: dict[str, Any], server: str, uri: str) -> None:
        self.spec, self.server, self.uri = spec, server, uri
        self.done: list[Any] = []

    def before_commit(self, attempt: int) -> None:
        if attempt == 0 and not self.done:
            self.done.append(run_ingestion(self.spec, shuffle_servers=[self.server],
                                           output_dir=self.uri))


def test_two_ingestions_committing_at_once_are_both_applied(
        spark: Any, daemon: Any, catalog: Any, dataset: Any) -> None:
    base, good = dataset
    uri = "iceberg://t/druid.raced"
    run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri)
    racer = CommitInBetween(_events(base, appendToExisting=True), daemon.url, uri)
    late = run_ingestion(_events(base, appendToExisting=True), shuffle_servers=[daemon.url],
                         output_dir=uri, hooks=racer)
    table = catalog.load_table("druid.raced")
    versions = [s.summary["shuffled.version"] for s in table.snapshots()]
    assert versions[1:] == [racer.done[0].version, late.version]  # both, the racer first
    assert _rows(table).num_rows == 3 * expected_rollup(good).num_rows


class Fail(Hooks):
    def before_commit(self, attempt: int) -> None:
        raise RuntimeError("injected failure at the commit point")


def test_a_failed_run_adds_no_snapshot_and_no_file(
        spark: Any, daemon: Any, catalog: Any, dataset: Any) -> None:
    base, good = dataset
    uri = "iceberg://t/druid.failing"
    run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri)
    table = catalog.load_table("druid.failing")
    before = [s.snapshot_id for s in table.snapshots()]
    with pytest.raises(RuntimeError, match="injected"):
        run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri, hooks=Fail())
    table = catalog.load_table("druid.failing")
    assert [s.snapshot_id for s in table.snapshots()] == before
    assert _files_under(table) == _referenced(table)
    assert_matches(_as_output(_rows(table)), expected_rollup(good))


def test_postgresql_catalog_with_an_s3_warehouse(
        spark: Any, daemon: Any, dataset: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.postgres import postgres_server
    from tests.helpers.s3 import moto_s3

    base, good = dataset
    with postgres_server() as url, moto_s3() as (fs, env):
        fs.create_dir("lake")
        for key, value in {"TYPE": "sql", "URI": url, "WAREHOUSE": "s3://lake/warehouse",
                           "S3__ENDPOINT": env["AWS_ENDPOINT_URL_S3"],
                           "S3__ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
                           "S3__SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
                           "S3__REGION": env["AWS_REGION"]}.items():
            monkeypatch.setenv(f"PYICEBERG_CATALOG__PG__{key}", value)
        from shuffled.spark.phase2.iceberg import load_catalog

        uri = "iceberg://pg/druid.events"
        first = run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri)
        catalog = load_catalog("pg")
        assert type(catalog).__name__ == "SqlCatalog" and catalog.engine.dialect.name == "postgresql"
        table = catalog.load_table("druid.events")
        assert table.location() == "s3://lake/warehouse/druid/events"
        assert_matches(_as_output(_rows(table)), expected_rollup(good))
        assert all(s["path"].startswith("s3://lake/warehouse/druid/events/data/")
                   for s in first.segments)

        with pytest.raises(RuntimeError, match="injected"):  # uploaded, then not committed
            run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri,
                          hooks=Fail())
        run_ingestion(_events(base), shuffle_servers=[daemon.url], output_dir=uri)
        table = catalog.load_table("druid.events")
        assert len(table.snapshots()) == 2
        assert_matches(_as_output(_rows(table)), expected_rollup(good))
        import pyarrow.fs as pafs

        stored = {f"s3://{i.path}" for i in fs.get_file_info(
            pafs.FileSelector("lake/warehouse/druid/events/data", recursive=True))
            if i.type == pafs.FileType.File}
        assert stored == _referenced(table)  # the failed run's uploads were deleted


@pytest.mark.parametrize("uri", ["iceberg://cat/table", "iceberg:///ns.t", "iceberg://c/ns.t/x",
                                 "iceberg://c/ns."])
def test_a_malformed_iceberg_output_is_refused_before_anything_runs(uri: str) -> None:
    from shuffled.cli.ingest import Refused, probe_output
    from shuffled.spark.phase2.iceberg import parse_uri

    with pytest.raises(ValueError, match="NAMESPACE.TABLE"):
        parse_uri(uri)
    with pytest.raises(Refused, match="not an Iceberg table"):
        probe_output(uri)
    assert str(parse_uri("iceberg://lake/a.b.events")) == "iceberg://lake/a.b.events"
    assert parse_uri("iceberg://lake/a.b.events").namespace == "a.b"
