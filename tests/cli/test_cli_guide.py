"""Issue 39's messages and tools of `shuffled ingest`, run as a user would (subprocesses):
``--validate`` runs nothing, ``--master`` is checked before a JVM starts, a wrong signing
secret is named as such, and Ctrl-C ends with one line and no empty directory."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.procs import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
SPEC = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())
SPEC["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(ROOT / "examples/rollup-tutorial")


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return subprocess.run([sys.executable, "-m", "shuffled", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, **kwargs)  # type: ignore[call-overload]


def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    return path


def test_validate_checks_everything_prints_the_plan_and_runs_nothing(tmp_path: Path) -> None:
    with DaemonProcess([tmp_path / "loc"]) as daemon:
        done = run(["ingest", str(spec_file(tmp_path)), "--validate", "--shuffle-server",
                    daemon.url, "--output", str(tmp_path / "out")])
        listed = json.loads(subprocess.run(
            ["curl", "-s", f"{daemon.url}/druid/worker/v1/shuffle/tasks"], capture_output=True,
            text=True, timeout=30).stdout)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("spec: valid (rollup-tutorial: ")
    assert any(ln.startswith("input: 1 json file from ") for ln in lines), lines
    assert any(ln.startswith("partitioning: dynamic") for ln in lines), lines
    assert "shuffle: 1 daemon answering their health check" in lines, lines
    assert lines[-1] == "nothing was run: drop --validate to run it"
    assert "Spark" not in done.stdout  # no session was started
    assert not (tmp_path / "out").exists() and listed["files"] == 0


def test_validate_refuses_what_the_run_would_refuse(tmp_path: Path) -> None:
    spec = json.loads(json.dumps(SPEC))
    spec["spec"]["dataSchema"]["dimensionsSpec"]["dimensions"][0] = {"type": "strnig",
                                                                     "name": "srcIP"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    done = run(["ingest", str(path), "--validate", "--output", str(tmp_path / "out")])
    assert done.returncode == 1 and "dimensions[0]" in done.stderr, done.stderr


def test_a_master_spark_cannot_parse_is_a_usage_error() -> None:
    done = run(["ingest", "spec.json", "--master", "bogus://x"])
    assert done.returncode == 2, done.stderr
    assert "is not a Spark master URL: give local[*]" in done.stderr
    assert "Exception" not in done.stderr and "at org.apache" not in done.stderr


def test_a_wrong_signing_secret_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "theirs").write_text(secrets.token_urlsafe(32))
    (tmp_path / "mine").write_text(secrets.token_urlsafe(32))
    with DaemonProcess([tmp_path / "loc"], "--signing-secret-file",
                       str(tmp_path / "theirs")) as daemon:
        done = run(["ingest", str(spec_file(tmp_path)), "--shuffle-server", daemon.url,
                    "--signing-secret-file", str(tmp_path / "mine"),
                    "--output", str(tmp_path / "out")])
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert "--signing-secret-file" in line and str(tmp_path / "mine") in line, line
    assert "--auth-token-file" not in line, line


def test_ctrl_c_ends_with_one_line_and_leaves_no_empty_directory(tmp_path: Path) -> None:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "shuffled", "ingest", str(spec_file(tmp_path)), "--output",
         str(tmp_path / "out")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        seen = []
        for line in proc.stdout:  # until phase 1 starts (Spark is up, data is moving)
            seen.append(line)
            if line.startswith("phase 1") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    # the Spark UI's address was printed when the session started
    assert any(ln.startswith("Spark ") and " on local[*], its UI at http://" in ln
               for ln in seen), seen
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("shuffled ingest: interrupted (Ctrl-C)"), err
    ds = tmp_path / "out" / "rollup-tutorial"
    leftovers = [p for p in ds.rglob("*") if p.is_dir() and not any(p.iterdir())]
    assert not leftovers, leftovers
    report = json.loads((ds / "task-report.json").read_text())
    assert "interrupted" in json.dumps(report)


def test_the_quiet_ingest_drops_py4js_own_log_records() -> None:
    """The Ctrl-C test above saw py4j's "Exception while sending command" (logged at ERROR
    through the root logger as the interrupt cancelled Spark's jobs mid-call) print
    beside the one line, once in a clean-clone run: the quiet command filters py4j's
    records; everything else still goes out."""
    import logging

    from shuffled.cli.ingest import not_py4j

    def record(path: str) -> logging.LogRecord:
        return logging.LogRecord("root", logging.ERROR, path, 1, "x", None, None)

    assert not not_py4j(record("/venv/lib/python3.11/site-packages/py4j/clientserver.py"))
    assert not_py4j(record("/work/shuffled/spark/driver/pipeline.py"))
