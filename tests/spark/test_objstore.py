"""Object-store input and output against a real S3-compatible server (moto's standalone
server from PyPI, on loopback, credentials generated per run) and a real HTTP server:
a spec reading ``s3://`` Parquet and JSON (and ``http://`` JSON) and writing segments back
to the store publishes the same rows as the local run."""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from shuffled.spark import SpecError, parse_spec, run_ingestion
from tests.helpers.cli import ingest_cli_runs
from tests.helpers.ingestion import generate, spark, start_daemon  # noqa: F401
from tests.helpers.s3 import moto_s3

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed "
                                  "(it is in the test extras)")
KEYS = ["__time", "country", "device"]



@pytest.fixture(scope="module")
def store() -> Any:
    """A moto S3 server on loopback and the AWS environment pointing at it."""
    with moto_s3() as (fs, env):
        fs.create_dir("shuffled-in")
        fs.create_dir("shuffled-out")
        yield fs, env


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, store: Any) -> dict[str, Any]:
    """The same rows as local JSON, local Parquet and objects in the store."""
    fs, _ = store
    local = tmp_path_factory.mktemp("objin")
    lines, good, _ = generate(3000, seed=11)
    (local / "json").mkdir()
    for i in range(2):
        part = "\n".join(lines[i::2]) + "\n"
        (local / "json" / f"part-{i}.json").write_text(part)
        with fs.open_output_stream(f"shuffled-in/json/part-{i}.json") as out:
            out.write(part.encode())
    table = pa.table({"ts": pa.array([g["ms"] for g in good], pa.int64()).cast(
                          pa.timestamp("ms", tz="UTC")),
                      "country": [g["country"] for g in good],
                      "device": [g.get("device") for g in good],
                      "clicks": pa.array([g["clicks"] for g in good], pa.int64()),
                      "revenue": pa.array([g["revenue"] for g in good], pa.float64())})
    (local / "parquet").mkdir()
    pq.write_table(table, local / "parquet" / "p.parquet", row_group_size=500)
    with fs.open_output_stream("shuffled-in/parquet/p.parquet") as out:
        out.write((local / "parquet" / "p.parquet").read_bytes())
    return {"local": local, "good": good}


def _spec(source: dict[str, Any], fmt: str) -> dict[str, Any]:
    spec = _base()
    spec["spec"]["ioConfig"]["inputSource"] = source
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": fmt}
    if fmt == "parquet":
        spec["spec"]["dataSchema"]["timestampSpec"]["format"] = "auto"
    return spec


def _base() -> dict[str, Any]:
    from tests.helpers.ingestion import base_spec

    spec = base_spec(Path("."), {"type": "hashed", "numShards": 2})
    spec["spec"]["tuningConfig"]["totalNumMergeTasks"] = 2
    spec["spec"]["tuningConfig"]["maxSavedParseExceptions"] = 1000  # all: comparable
    return spec


def _published(fs: pafs.FileSystem | None, base: str) -> list[tuple[Any, ...]]:
    """Every published row, sorted, read through the manifest only."""
    read = (lambda p: fs.open_input_stream(p).read()) if fs else (lambda p: Path(p).read_bytes())
    manifest = json.loads(read(f"{base}/manifest.json"))
    rows = []
    for seg in manifest["segments"]:
        table = pq.read_table(pa.BufferReader(read(f"{base}/{seg['path']}")))
        cols = [[round(v, 6) if isinstance(v, float) else v for v in table.column(c).to_pylist()]
                for c in table.column_names]  # sums in another order differ in the last bits
        rows += list(zip(*cols))
    return sorted(rows, key=repr)


REMOTE = [("json", "auto"), ("parquet", "native"), ("parquet", "jvm")]


@pytest.fixture(scope="module")
def remote_runs(store: Any, data: Any, tmp_path_factory: pytest.TempPathFactory,
                ) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """``shuffled ingest`` of each s3:// input to s3:// output (by format and phase-1
    reader): one fresh process, whose JVM sees the AWS environment, for all three runs
    (a JVM each would cost its start three times)."""
    _, env = store
    tmp = tmp_path_factory.mktemp("s3runs")
    runs = []
    for fmt, reader in REMOTE:
        path = tmp / f"{fmt}-{reader}.json"
        path.write_text(json.dumps(_spec({"type": "s3", "prefixes": [f"s3://shuffled-in/{fmt}/"],
                                          "filter": f"*.{fmt}"}, fmt)))
        runs.append([str(path), "--output", f"s3://shuffled-out/{fmt}-{reader}",
                     "--phase1-reader", reader])
    return dict(zip(REMOTE, ingest_cli_runs(tmp, runs, env=env)))


@pytest.mark.parametrize("fmt,reader", REMOTE)
def test_s3_in_and_out_publishes_what_the_local_run_does(spark: Any, store: Any, data: Any,
                                                         remote_runs: Any, tmp_path: Path,
                                                         fmt: str, reader: str) -> None:
    fs, _ = store
    local_out = tmp_path / "local"
    daemon = start_daemon(tmp_path / "loc")
    try:
        local = _spec({"type": "local", "baseDir": str(data["local"] / fmt), "filter": f"*.{fmt}"},
                      fmt)
        # JSON: the local run reads through the JVM, the store's natively (auto)
        local_run = run_ingestion(local, shuffle_servers=[daemon.url], output_dir=str(local_out),
                                  reader="jvm" if fmt == "json" else "auto")
    finally:
        daemon.stop()
    out = f"shuffled-out/{fmt}-{reader}"
    done = remote_runs[fmt, reader]  # a fresh JVM sees the AWS env
    assert done.returncode == 0, done.stderr[-3000:]
    want = _published(None, str(local_out / "events"))
    assert want and _published(fs, f"{out}/events") == want
    report = json.loads(fs.open_input_stream(f"{out}/events/task-report.json").read())
    assert report["status"] == "SUCCESS"
    ran = report["phases"]["partialSegmentGeneration"]["reader"]
    assert ran == ("jvm" if reader == "jvm" else "native")
    if fmt == "json":  # the same bad lines, numbered alike (files named each their way)
        events = [sorted((e["line"], e["message"], e["raw"]) for e in r["ingestionStatsAndErrors"]
                         ["unparseableEvents"]) for r in (report, local_run.report)]
        assert events[0] == events[1] and events[0]


def test_http_json_input(spark: Any, store: Any, data: Any, tmp_path: Path) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(data["local"] / "json"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    daemon = start_daemon(tmp_path / "loc")
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        spec = _spec({"type": "http", "uris": [f"{base}/part-0.json", f"{base}/part-1.json"]},
                     "json")
        fetched = run_ingestion(spec, shuffle_servers=[daemon.url], output_dir=str(tmp_path / "h"))
        local = _spec({"type": "local", "baseDir": str(data["local"] / "json"),
                       "filter": "*.json"}, "json")
        run_ingestion(local, shuffle_servers=[daemon.url], output_dir=str(tmp_path / "l"),
                      reader="jvm")
    finally:
        daemon.stop()
        server.shutdown()
        thread.join(timeout=10)
    assert _published(None, str(tmp_path / "h" / "events")) == \
        _published(None, str(tmp_path / "l" / "events"))
    assert fetched.report["phases"]["partialSegmentGeneration"]["reader"] == "native"


@pytest.mark.parametrize("source,where", [
    ({"type": "s3", "uris": ["http://x/y"]}, "$.spec.ioConfig.inputSource.uris[0]"),
    ({"type": "s3", "prefixes": ["s3://a/"], "uris": ["s3://a/b"]}, "$.spec.ioConfig.inputSource"),
    ({"type": "s3", "uris": ["s3://a/b"], "properties": {"accessKeyId": "x"}},
     "$.spec.ioConfig.inputSource.properties"),
    ({"type": "http", "uris": []}, "$.spec.ioConfig.inputSource.uris"),
    ({"type": "google", "uris": ["gs://a/b"]}, "$.spec.ioConfig.inputSource.type"),
])
def test_bad_object_store_sources_are_refused_by_path(source: dict[str, Any], where: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(source, "json"))
    assert info.value.path == where


def test_a_failed_ingestion_leaves_no_manifest_in_the_store(spark: Any, store: Any, data: Any,
                                                            tmp_path: Path) -> None:
    """The manifest is the commit point: a run failing after phase 1 (too many parse
    exceptions) writes its FAILED report to the store and no manifest."""
    fs, _ = store
    spec = _spec({"type": "local", "baseDir": str(data["local"] / "json"), "filter": "*.json"},
                 "json")
    spec["spec"]["tuningConfig"]["maxParseExceptions"] = 0
    daemon = start_daemon(tmp_path / "loc")
    try:
        with pytest.raises(Exception, match="Max parse exceptions"):
            run_ingestion(spec, shuffle_servers=[daemon.url],
                          output_dir="s3://shuffled-out/failed")
    finally:
        daemon.stop()
    base = "shuffled-out/failed/events"
    assert fs.get_file_info(f"{base}/manifest.json").type == pafs.FileType.NotFound
    report = json.loads(fs.open_input_stream(f"{base}/task-report.json").read())
    assert report["status"] == "FAILED" and "Max parse exceptions" in report["errorMsg"]
    segments = fs.get_file_info(pafs.FileSelector(f"{base}/segments", allow_not_found=True))
    assert segments == []  # it failed before publishing: nothing was uploaded
