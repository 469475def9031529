"""End-to-end: real Spark (local[2,4]) + real daemons on loopback, results checked against DuckDB."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shuffled.client import ShuffleClient
from shuffled.protocol import parse_instant
from shuffled.spark import IngestionFailed, run_ingestion
from shuffled.spark.phase2.publish import FS_TOPDIR_FL
from tests.spark.phase2.test_version_folders import _flags, _fs_type
from tests.helpers.hooks import FailAttempts, SeeFrozen
from tests.helpers.ingestion import (  # noqa: F401  (fixtures)
    BASE,
    HOUR,
    _ms,
    assert_matches,
    base_spec,
    daemons,
    expected_rollup,
    free_port,
    generate,
    held_tasks,
    read_output,
    spark,
    start_daemon,
    write_parts,
)

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["__time", "country", "device"]


def assert_segments_sorted(out_dir: Path, manifest: dict[str, Any]) -> None:
    for seg in manifest["segments"]:
        t = pq.read_table(out_dir / "events" / seg["path"])
        ms = _ms(t)
        start, end = seg["interval"].split("/")
        keys = list(zip(ms, [c or "" for c in t.column("country").to_pylist()],
                        [(d is not None, d or "") for d in t.column("device").to_pylist()]))
        assert keys == sorted(keys)
        assert seg["rows"] == t.num_rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], int]:
    base = tmp_path_factory.mktemp("input")
    lines, good, bad = generate(12000, seed=7)
    write_parts(lines, base / "json", parts=3)
    return base / "json", good, bad


def test_tutorial_rollup_gives_the_documented_rows(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())
    monkeypatch.chdir(ROOT)
    daemon = start_daemon(tmp_path / "loc")
    try:
        result = run_ingestion(spec, shuffle_servers=[daemon.url], output_dir=str(tmp_path / "out"))
        assert held_tasks(daemon.url) == []
    finally:
        daemon.stop()
    manifest, out = read_output(tmp_path / "out", "rollup-tutorial")
    assert [s["interval"] for s in manifest["segments"]] == [
        "2018-01-01T00:00:00.000Z/2018-01-08T00:00:00.000Z"]
    rows = [{**r, "__time": t} for t, r in zip(_ms(out), out.drop_columns(["__seg"]).to_pylist())]
    documented = json.loads((ROOT / "examples/rollup-tutorial/expected-rows.json").read_text())
    for row in documented:
        row["__time"] = parse_instant(row["__time"])
    assert rows == documented
    report = json.loads(Path(result.report_path).read_text())
    assert report["status"] == "SUCCESS"
    assert report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]["processed"] == 9


@pytest.mark.parametrize("partitions", [
    {"type": "hashed", "numShards": 3, "partitionDimensions": ["country"]},
    {"type": "hashed", "targetRowsPerSegment": 400},
    {"type": "range", "partitionDimensions": ["country", "device"], "targetRowsPerSegment": 500},
    {"type": "single_dim", "partitionDimension": "country", "targetRowsPerSegment": 500},
], ids=["hashed-numShards", "hashed-determined", "range", "single_dim"])
def test_rollup_equals_independent_computation(spark: Any, daemons: list[Any], dataset: Any,
                                               tmp_path: Path, partitions: dict[str, Any]) -> None:
    base, good, bad = dataset
    spec = base_spec(base, partitions, maxNumConcurrentSubTasks=4, totalNumMergeTasks=3)
    messages: list[str] = []
    result = run_ingestion(spec, shuffle_servers=[d.url for d in daemons],
                           output_dir=str(tmp_path / "out"), progress=messages.append)
    manifest, out = read_output(tmp_path / "out")
    assert_matches(out, expected_rollup(good))
    assert_segments_sorted(tmp_path / "out", manifest)
    intervals = {s["interval"].split("/")[0][:10] for s in manifest["segments"]}
    assert intervals == {"2018-03-01", "2018-03-02", "2018-03-03"}
    stats = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
    thrown = sum(1 for g in good if not BASE <= g["ms"] < BASE + 72 * HOUR)
    erred = sum(1 for g in good if g.get("error"))  # a metric not a number: kept
    assert stats["unparseable"] == bad and stats["thrownAway"] == thrown
    assert stats["processed"] == len(good) - thrown - erred
    assert erred and stats["processedWithError"] == erred
    events = result.report["ingestionStatsAndErrors"]["unparseableEvents"]
    assert events and all(e["file"].endswith(".json") and e["line"] for e in events)
    assert any(m.startswith("phase 1 done") for m in messages)
    kinds = {s["shardSpec"]["type"] for s in manifest["segments"]}
    assert kinds == {"hashed": {"hashed"}, "range": {"range"},
                     "single_dim": {"single"}}[partitions["type"]]
    per_interval: dict[str, int] = {}
    for s in manifest["segments"]:
        per_interval[s["interval"]] = per_interval.get(s["interval"], 0) + 1
    assert max(per_interval.values()) > 1  # secondary partitioning happened
    for d in daemons:
        assert held_tasks(d.url) == []


def test_the_heap_is_frozen_while_an_ingestion_runs(spark: Any, daemons: list[Any],
                                                   dataset: Any, tmp_path: Path) -> None:
    """The driver's collector walks only what the ingestion makes (the process's older
    objects frozen: .gcpause), and the process gets its objects back afterwards, after a
    failed ingestion too."""
    import gc

    base, _, _ = dataset
    seen = SeeFrozen()
    run_ingestion(base_spec(base, {"type": "hashed", "numShards": 2}),
                  shuffle_servers=[daemons[0].url], output_dir=str(tmp_path / "out"),
                  hooks=seen)
    assert seen.seen and seen.seen[0] > 10_000, seen.seen  # pyspark, py4j, pyarrow...
    assert gc.get_freeze_count() == 0
    with pytest.raises(Exception, match="injected phase-1 failure"):
        run_ingestion(base_spec(base, {"type": "hashed", "numShards": 2}),
                      shuffle_servers=[daemons[0].url], output_dir=str(tmp_path / "failed"),
                      hooks=FailAttempts(partitions=[0], attempts=(0, 1, 2, 3)))
    assert gc.get_freeze_count() == 0


def test_failed_attempts_and_daemon_restart_keep_totals_exact(
        spark: Any, dataset: Any, tmp_path: Path) -> None:
    base, good, _ = dataset
    port = free_port()
    locs = [tmp_path / "locA", tmp_path / "locB"]
    first = start_daemon(locs[0], port=port)
    second = start_daemon(locs[1])
    live = [first, second]
    held: set[str] = set()
    committed: set[str] = set()
    task_id = "failure-test-1"
    out = tmp_path / "out"

    def on_progress(msg: str) -> None:
        if msg.startswith("phase 1 done"):
            for d in live:  # what the daemons hold vs what the committed attempts wrote
                with ShuffleClient(d.url) as c:
                    for part in (c.task(task_id) or {}).get("partitions", []):
                        held.update(s["subTaskId"] for s in part["subTasks"])
            lines = (out / "events" / f".staging-{task_id}" / "phase1-committed.jsonl").read_text()
            committed.update(json.loads(x).get("sub", "") for x in lines.splitlines())
            live[0].stop()  # restart daemon A between the phases
            live[0] = start_daemon(locs[0], port=port)

    spec = base_spec(base, {"type": "hashed", "numShards": 2}, maxRowsInMemory=1000,
                     maxBytesInMemory=1 << 16)  # several flushes per task
    spec["id"] = task_id
    fault = FailAttempts(partitions=[0, 1, 2], attempts=[0], after_uploads=2)
    try:
        # The JVM reader: its data source sink writes the committed list read above.
        result = run_ingestion(spec, shuffle_servers=[first.url, second.url],
                               output_dir=str(out), progress=on_progress,
                               hooks=fault, keepalive_seconds=0.5, reader="jvm")
        assert held_tasks(live[0].url) == [] and held_tasks(second.url) == []
    finally:
        for d in live:
            d.stop()
    manifest, out = read_output(tmp_path / "out")
    assert_matches(out, expected_rollup(good))
    # Segments were written in place: every file there is one the manifest names.
    ds = tmp_path / "out" / "events"
    assert sorted(str(p.relative_to(ds)) for p in ds.rglob("*.parquet")) == sorted(
        s["path"] for s in manifest["segments"])
    if _fs_type(ds).startswith("ext"):  # each version folder apart from the last one's
        assert _flags(ds / "segments") & FS_TOPDIR_FL
    attempts = [s["attemptNumber"] for s in result.report["subtasks"]]
    assert any(a > 0 for a in attempts), "no phase-1 attempt was retried"
    leftovers = held - committed - {"supervisor-keepalive"}
    assert leftovers, "failed attempts left no partials behind: the test proves nothing"
    assert all(sub.startswith("p") for sub in leftovers)
    for loc in locs:
        leftovers = [p for p in loc.rglob("*") if p.is_file() and p.name != ".lock"
                     and not p.name.startswith(".")
                     and ".shuffled" not in p.relative_to(loc).parts]  # the catalog
        assert leftovers == [] or all(p.stat().st_size == 0 for p in leftovers), leftovers


def test_too_many_parse_exceptions_fails_clearly_and_cleans_up(
        spark: Any, daemons: list[Any], dataset: Any, tmp_path: Path) -> None:
    base, _, bad = dataset
    spec = base_spec(base, {"type": "hashed", "numShards": 1}, maxParseExceptions=bad - 1)
    with pytest.raises(IngestionFailed, match=r"Max parse exceptions \[\d+\] exceeded.*part-\d\.json:\d+"):
        run_ingestion(spec, shuffle_servers=[d.url for d in daemons], output_dir=str(tmp_path / "out"))
    report = json.loads((tmp_path / "out" / "events" / "task-report.json").read_text())
    assert report["status"] == "FAILED" and "Max parse exceptions" in report["errorMsg"]
    assert not (tmp_path / "out" / "events" / "manifest.json").exists()
    assert not list((tmp_path / "out" / "events").glob("segments/*")), "a failed run's folder stayed"
    for d in daemons:
        assert held_tasks(d.url) == []


def test_new_version_replaces_intervals_and_append_adds(spark: Any, daemons: list[Any],
                                                       tmp_path: Path) -> None:
    lines, good, _ = generate(600, seed=3)
    clean = [ln for ln in lines if '"ts": "20' in ln and "many" not in ln and ln.endswith("}")]
    src = tmp_path / "in"
    write_parts(clean, src, parts=1)
    urls = [daemons[0].url]
    spec = base_spec(src, {"type": "hashed", "numShards": 2})
    out = tmp_path / "out"
    run_ingestion(spec, shuffle_servers=urls, output_dir=str(out))
    m1, t1 = read_output(out)
    run_ingestion(spec, shuffle_servers=urls, output_dir=str(out))
    m2, t2 = read_output(out)
    assert {s["version"] for s in m2["segments"]} != {s["version"] for s in m1["segments"]}
    assert len({s["version"] for s in m2["segments"]}) == 1
    assert t2.num_rows == t1.num_rows
    for s in m1["segments"]:
        assert not (out / "events" / s["path"]).exists()
    spec["spec"]["ioConfig"]["appendToExisting"] = True
    # Druid refuses appending with perfect rollup (forceGuaranteedRollup): append dynamically.
    spec["spec"]["tuningConfig"].update(forceGuaranteedRollup=False, partitionsSpec={"type": "dynamic"})
    run_ingestion(spec, shuffle_servers=urls, output_dir=str(out))
    m3, t3 = read_output(out)
    assert t3.num_rows == 2 * t2.num_rows
    assert pc.sum(t3.column("count")).as_py() == 2 * pc.sum(t2.column("count")).as_py()
    assert {s["version"] for s in m3["segments"]} == {s["version"] for s in m2["segments"]}
    nums = [(s["interval"], s["partitionNum"]) for s in m3["segments"]]
    assert len(nums) == len(set(nums))


def test_csv_inline_and_parquet_inputs(spark: Any, daemons: list[Any], tmp_path: Path) -> None:
    csv = "ts,country,device,clicks,revenue\n" + "\n".join(
        f"2018-03-01T0{i % 3}:1{i % 6}:00Z,c{i % 4},{'ios' if i % 2 else ''},{i},{i / 10}"
        for i in range(60)) + "\nbroken,line\n"
    spec = base_spec(tmp_path, {"type": "hashed", "numShards": 2})
    spec["spec"]["ioConfig"]["inputSource"] = {"type": "inline", "data": csv}
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": "csv", "findColumnsFromHeader": True}
    r1 = run_ingestion(spec, shuffle_servers=[daemons[1].url], output_dir=str(tmp_path / "o1"))
    stats = r1.report["ingestionStatsAndErrors"]
    assert stats["rowStats"]["buildSegments"]["unparseable"] == 1
    assert stats["unparseableEvents"][0]["line"] == 62
    _, t1 = read_output(tmp_path / "o1")
    assert pc.sum(t1.column("count")).as_py() == 60
    assert pc.sum(t1.column("clicks")).as_py() == sum(range(60))
    table = pa.table({"ts": pa.array([BASE + i * 60_000 for i in range(50)], pa.timestamp("ms", tz="UTC")),
                      "country": [f"c{i % 3}" for i in range(50)], "device": ["web"] * 50,
                      "clicks": list(range(50)), "revenue": [1.5] * 50})
    (tmp_path / "pq").mkdir()
    pq.write_table(table, tmp_path / "pq" / "data.parquet")
    spec["spec"]["ioConfig"]["inputSource"] = {"type": "local", "baseDir": str(tmp_path / "pq"),
                                               "filter": "*.parquet"}
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": "parquet"}
    run_ingestion(spec, shuffle_servers=[daemons[1].url], output_dir=str(tmp_path / "o2"))
    _, t2 = read_output(tmp_path / "o2")
    assert t2.num_rows == 3 and pc.sum(t2.column("count")).as_py() == 50
    assert pc.sum(t2.column("clicks")).as_py() == sum(range(50))
    shutil.rmtree(tmp_path / "pq")


def test_progress_line_counts_rows_of_finished_tasks_while_the_job_runs(
        spark: Any, tmp_path: Path) -> None:
    """The live progress line: tasks done and the rows their accumulator reported, read
    while the second task is still running (it waits for a file the test writes)."""
    import os
    import threading
    import time

    from shuffled.spark.driver.monitor import RowCount, stage_status

    rows = RowCount(spark)
    rows.start()
    status = stage_status(spark, lambda: "phase 2 (merge)", lambda: (2_000_000, 500_000), rows)
    acc = rows.acc
    flag = str(tmp_path / "go")

    def task(index: int, it: Any) -> Any:
        if index == 1:
            deadline = time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.05)  # poll interval of a bounded wait for the test's file
        acc.add(1234 if index == 0 else 1)
        return iter([index])

    job = threading.Thread(target=lambda: spark.sparkContext.parallelize([0, 1], 2)
                           .mapPartitionsWithIndex(task).collect(), daemon=True)
    job.start()
    try:
        seen = ""
        deadline = time.monotonic() + 60
        while "1/2 tasks done" not in seen and time.monotonic() < deadline:
            seen = status() or ""
            time.sleep(0.05)  # poll interval of a bounded wait
        assert seen == "phase 2 (merge): 1/2 tasks done, 1,234 rows, 0.5 MB of 2.0 MB read"
    finally:
        open(flag, "w").close()
        job.join(timeout=60)
    assert rows() == 1235


def test_progress_of_a_phase_of_several_jobs_counts_the_latest_one(spark: Any) -> None:
    """Issue 39: "determine partitions: 6/13 tasks done" grew its total as the phase
    submitted job after job. The line counts the latest job's tasks and names it."""
    from shuffled.spark.driver.monitor import stage_status

    sc = spark.sparkContext
    group = "progress-jobs-test"
    status = stage_status(spark, lambda: "determine partitions", group=lambda: group)
    sc.setJobGroup(group, "test")
    try:
        sc.parallelize(range(10), 3).count()
        first = status()
        sc.parallelize(range(10), 5).count()
        second = status()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert first == "determine partitions: 3/3 tasks done", first
    assert second == "determine partitions (job 2): 5/5 tasks done", second


def test_progress_bytes_never_fall_behind_the_finished_tasks(spark: Any) -> None:
    """Issue 39: "1/2 tasks done, 145,964 rows, 0.0 MB shuffled" while the daemon held
    26 MB: the bytes came only from the daemons' last heartbeat. The finished tasks'
    own figure now counts too, whichever is further along."""
    from shuffled.spark.driver.monitor import stage_status

    sc = spark.sparkContext
    group = "progress-bytes-test"
    heartbeat = [(0, 0)]  # no heartbeat answered since the tasks finished
    status = stage_status(spark, lambda: "phase 1 (partial segments)", lambda: heartbeat[0],
                          lambda: 145_964, group=lambda: group, shuffled=lambda: 26_000_000)
    sc.setJobGroup(group, "test")
    try:
        sc.parallelize(range(10), 2).count()
        stale = status()
        heartbeat[0] = (31_000_000, 0)  # the daemons' figure, once it came, is further
        fresh = status()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert stale == "phase 1 (partial segments): 2/2 tasks done, 145,964 rows, 26.0 MB shuffled"
    assert fresh == "phase 1 (partial segments): 2/2 tasks done, 145,964 rows, 31.0 MB shuffled"
