"""No silent hang (issue 36): a Spark job that makes no progress for the stall timeout, or
a driver JVM out of heap, fails the ingestion with one paragraph naming what stalled and
what to try, the shuffle data deleted, exit code 1. Each is provoked for real: a phase-1
task that blocks on an event nothing sets, a driver given the smallest heap Spark starts
with (spark.driver.memory 512m, set before its JVM starts) made to collect more than that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import ingest_cli
from tests.helpers.hooks import BlockPhase1
from tests.helpers.ingestion import (  # noqa: F401  (spark: a fixture)
    base_spec, generate, held_tasks, spark, start_daemon, write_parts,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark


def _input(tmp_path: Path) -> Path:
    lines, _good, _bad = generate(3000, seed=3)
    write_parts(lines, tmp_path / "in", parts=2)
    return tmp_path / "in"


def test_a_blocked_task_fails_the_ingestion_at_the_stall_timeout(spark: Any, tmp_path: Path,
                                                                 ) -> None:
    from shuffled.spark import run_ingestion
    from shuffled.spark.driver.job import IngestionFailed

    spec = base_spec(_input(tmp_path), {"type": "hashed", "numShards": 2},
                     maxNumConcurrentSubTasks=2, maxRowsInMemory=1000)
    daemon = start_daemon(tmp_path / "loc")
    try:
        started = time.monotonic()
        with pytest.raises(IngestionFailed) as failed:
            run_ingestion(spec, shuffle_servers=[daemon.url], output_dir=str(tmp_path / "out"),
                          hooks=BlockPhase1(seconds=60), stall_seconds=5)
        took = time.monotonic() - started
        held = held_tasks(daemon.url)
    finally:
        daemon.stop()
    what = failed.value.message
    assert what.startswith("phase 1 (partial segments) made no progress for 5 s"), what
    assert "tasks done" in what and "were cancelled" in what
    assert "--stall-timeout" in failed.value.details["hint"]
    assert took < 40, f"the stall took {took:.0f} s to fail (the blocked tasks wait 60 s)"
    assert held == []  # the shuffle data was deleted
    report = json.loads((tmp_path / "out/events/task-report.json").read_text())
    assert report["status"] == "FAILED" and report["errorMsg"] == what
    assert set(report["cleanup"].values()) == {"deleted"}
    # the session is left usable: the blocked tasks were killed, not left running
    assert spark.sparkContext.parallelize(range(10), 2).count() == 10


def _cli(tmp_path: Path, spec: dict[str, Any], *extra: str,
         timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return ingest_cli(tmp_path, spec, *extra, timeout=timeout)


def _one_paragraph(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    failure = [ln for ln in done.stderr.splitlines() if ln.startswith("shuffled ingest failed: ")]
    assert len(failure) == 1 and "Try: " in failure[0], done.stderr[-3000:]
    return failure[0]


def _submit_args(env: dict[str, str], confs: list[tuple[str, str]]) -> str:
    from shuffled.cli.ingest import submit_args

    saved = os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
    try:
        return submit_args(confs, quiet=True)
    finally:
        if saved is not None:
            os.environ["PYSPARK_SUBMIT_ARGS"] = saved


def test_the_driver_out_of_heap_fails_at_once(tmp_path: Path) -> None:
    """The issue's failure, for real: a driver JVM of 512 MB (the least Spark starts with)
    collects 12 task results of 64 MB. Spark used to lose that OutOfMemoryError in its
    task-result-getter thread and wait forever; the JVM now exits, and the ingestion fails
    in one paragraph naming the driver's heap, the shuffle data deleted."""
    spec = base_spec(_input(tmp_path), {"type": "hashed", "numShards": 2})
    script = textwrap.dedent(f"""
        import json, sys
        from shuffled.server.embedded import EmbeddedDaemon
        from shuffled.spark import run_ingestion
        from shuffled.cli.ingest import explain
        from shuffled.client import ShuffleClient
        from tests.helpers.hooks import DriverCollects
        with EmbeddedDaemon([{str(tmp_path / "loc")!r}], free_space_reserve=0) as url:
            try:
                run_ingestion(json.loads(sys.argv[1]), shuffle_servers=[url],
                              output_dir={str(tmp_path / "out")!r}, hooks=DriverCollects(),
                              stall_seconds=60)
            except BaseException as exc:
                print(explain(exc, "spec.json"))
                with ShuffleClient(url) as c:
                    print("held", json.dumps(c.list_tasks().get("tasks", [])))
                sys.exit(1)
        """)
    # The JVM's options as `shuffled ingest --conf spark.driver.memory=512m` gives them
    # (its quiet logging is a driver Java option too: the flag must survive it).
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env["PYSPARK_SUBMIT_ARGS"] = _submit_args(env, [("spark.driver.memory", "512m")])
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=150)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-3000:]
    failure = [ln for ln in done.stdout.splitlines() if ln.startswith("shuffled ingest failed: ")]
    assert len(failure) == 1 and "Try: " in failure[0], done.stdout + done.stderr[-3000:]
    line = failure[0]
    assert "the Spark driver JVM ran out of memory (java.lang.OutOfMemoryError) during " \
           "phase 1" in line, line
    assert "(code 3, -XX:+ExitOnOutOfMemoryError)" in line, line  # the flag reached it
    assert "spark.driver.memory" in line.split("Try: ")[1]
    assert "held []" in done.stdout
    assert took < 90, f"{took:.0f} s"


class _Trickle:
    """An HTTP server whose every answer stops half way through its body (a stalled
    input server): the reader waits on the socket, well inside its own timeout."""

    def __init__(self, body: bytes) -> None:
        import http.server
        import threading

        self.release = threading.Event()
        release, payload = self.release, body

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                release.wait(60)  # bounded: the test sets it when done

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/events.json"

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_the_cli_fails_a_stalled_input_in_one_paragraph(tmp_path: Path) -> None:
    """`shuffled ingest --stall-timeout 5` on an input server that stops answering half way:
    exit 1 and one paragraph naming the phase that stalled and what to try, in seconds,
    not the reader's 60 s socket timeout (nor forever)."""
    lines, _good, _bad = generate(3000, seed=3)
    spec = base_spec(tmp_path, {"type": "hashed", "numShards": 2})
    with _Trickle(("\n".join(lines) + "\n").encode()) as url:
        spec["spec"]["ioConfig"]["inputSource"] = {"type": "http", "uris": [url]}
        started = time.monotonic()
        done = _cli(tmp_path, spec, "--stall-timeout", "5")
        took = time.monotonic() - started
    line = _one_paragraph(done)
    assert "made no progress for 5 s (the stall timeout)" in line, line
    assert "--stall-timeout" in line.split("Try: ")[1], line
    assert "The task report is at" in line
    report = json.loads((tmp_path / "out/events/task-report.json").read_text())
    assert report["status"] == "FAILED" and set(report["cleanup"].values()) == {"deleted"}
    assert took < 50, f"{took:.0f} s"


@pytest.mark.parametrize("text, said, tried", [
    ("Lost task 0.0 in stage 6.0 (TID 7) (localhost executor driver): TaskResultLost "
     "(result lost from block manager)", "a task's result was lost", "spark.driver.memory"),
    ("Lost task 1.0 in stage 0.0 (TID 1) (localhost executor driver): "
     "java.lang.OutOfMemoryError: Java heap space", "ran out of JVM heap", "spark.driver.memory"),
    ("Lost task 1.0 in stage 0.0 (TID 1) (10.0.0.7 executor 3): "
     "java.lang.OutOfMemoryError: Java heap space", "in an executor", "spark.executor.memory"),
    ("Total size of serialized results of 9 tasks (1100.0 MiB) is bigger than "
     "spark.driver.maxResultSize (1024.0 MiB)", "spark.driver.maxResultSize",
     "spark.driver.maxResultSize=4g"),
])
def test_spark_failures_are_named(text: str, said: str, tried: str) -> None:
    """The texts Spark fails these jobs with (the first two seen with a 512 MB driver) are
    named, with the setting to change; any other failure keeps its own message."""
    from shuffled.spark.driver import sparkfailure

    class Session:  # a session whose JVM this process did not start
        sparkContext = object()

    why = sparkfailure.explain(Session(), "determine partitions", RuntimeError(text))
    assert why is not None and said in why[0] and "determine partitions" in why[0]
    assert tried in why[1]
    assert sparkfailure.explain(Session(), "phase 2", RuntimeError("no such file")) is None
