"""`shuffled ingest` failing: one short paragraph on stderr (what failed, the task report,
what to try), exit code 1, no traceback unless --verbose; Spark's own logs quiet. Run as
a real subprocess, the way users meet it."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import ingest_cli

ROOT = Path(__file__).resolve().parents[2]
SPEC = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())


def _ingest(tmp_path: Path, spec: dict[str, Any], *extra: str,
            timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return ingest_cli(tmp_path, spec, *extra, timeout=timeout)


def _spec(**changes: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(SPEC))
    spec["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(ROOT / "examples/rollup-tutorial")
    for path, value in changes.items():
        node = spec
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return spec


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once we leave: a dead daemon's address


def _one_paragraph(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    failure = [ln for ln in lines if ln.startswith("shuffled ingest failed: ")]
    assert len(failure) == 1 and "Try: " in failure[0], done.stderr[-2000:]
    # at most a JVM notice besides it (the JVM prints 'Using incubator modules' itself)
    assert len(lines) <= 3, done.stderr[-2000:]
    return failure[0]


@pytest.mark.parametrize("change,expect", [
    ({"spec.dataSchema.granularitySpec.queryGranularity": "decade"},
     "$.spec.dataSchema.granularitySpec.queryGranularity"),
    ({"spec.ioConfig.inputSource.baseDir": "/nonexistent/shuffled-input"},
     "/nonexistent/shuffled-input"),
], ids=["bad-spec", "missing-input"])
def test_bad_input_is_one_paragraph(tmp_path: Path, change: dict[str, Any], expect: str) -> None:
    line = _one_paragraph(_ingest(tmp_path, _spec(**change)))
    assert expect in line


def test_unreachable_daemon_is_one_paragraph_and_verbose_shows_the_traceback(
        tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    line = _one_paragraph(_ingest(tmp_path, _spec(), "--shuffle-server", url))
    assert url in line and "health check" in line
    verbose = _ingest(tmp_path, _spec(), "--shuffle-server", url, "--verbose")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


def test_a_failed_spark_job_names_its_task_report(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    rows = (ROOT / "examples/rollup-tutorial/rollup-data.json").read_text()
    (data / "rollup-data.json").write_text(rows + "{not json\n")
    spec = _spec(**{"spec.ioConfig.inputSource.baseDir": str(data)})
    spec["spec"]["tuningConfig"]["maxParseExceptions"] = 0
    done = _ingest(tmp_path, spec)
    line = _one_paragraph(done)
    assert "Max parse exceptions [0] exceeded" in line
    report = tmp_path / "out" / "rollup-tutorial" / "task-report.json"
    assert f"The task report is at {report}" in line
    assert json.loads(report.read_text())["status"] == "FAILED"
    assert "WARN" not in done.stderr and "INFO" not in done.stderr  # Spark kept quiet


@pytest.mark.parametrize("content", [None, "{not json"], ids=["missing-spec", "not-json"])
def test_a_spec_file_that_is_missing_or_not_json(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "spec.json"
    if content is not None:
        path.write_text(content)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-m", "shuffled", "ingest", str(path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    line = _one_paragraph(done)
    assert str(path) in line or "Expecting" in line


class _Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_is_one_live_line_on_a_terminal(tty: bool) -> None:
    from shuffled.cli.terminal import Progress

    out = _Terminal(tty)
    progress = Progress(out)
    progress("phase 1: rolling up and shuffling partial segments")
    # Spark stops listing a stage when its last task ends: the last tick seen is 3/4.
    for done in (1, 2, 3):
        progress(f"phase 1 (partial segments): {done}/4 tasks done, {done * 1000:,} rows, "
                 f"{done / 2} MB shuffled")
    progress("phase 1 done: 4 subtasks, 100 rows")
    progress.close()
    text = out.getvalue()
    if tty:  # the ticks rewrite one line in place; the other messages are lines of their own
        assert text.count("\r\x1b[K") == 4  # three ticks, then the bar redrawn full
        assert "[##########..........] 2/4 tasks, 2,000 rows, 1.0 MB shuffled" in text
        last_bar = text.rsplit("\r\x1b[K", 1)[1]
        assert last_bar.startswith("phase 1 (partial segments): [####################] 4/4 "
                                   "tasks\nphase 1 done"), last_bar
        assert text.count("\n") == 3
    else:
        assert "\r" not in text and text.count("\n") == 5


def test_a_phase_of_several_jobs_ends_each_bar_full_on_a_terminal() -> None:
    """A phase that runs job after job (determine partitions) shows a bar per job: when
    the next job's first tick comes, the last job's bar is redrawn full and left on its
    line, and the phase's last bar ends full on its result line."""
    from shuffled.cli.terminal import Progress

    out = _Terminal(True)
    progress = Progress(out)
    progress("determine partitions: 0/1 tasks done")
    progress("determine partitions (job 2): 3/13 tasks done")
    progress("determine partitions: dynamic (hashed shards), 1 time chunk, 1 partition")
    progress.close()
    lines = out.getvalue().split("\n")
    assert lines[0].rsplit("\r\x1b[K", 1)[1] == \
        "determine partitions: [####################] 1/1 tasks"
    assert lines[1].rsplit("\r\x1b[K", 1)[1] == \
        "determine partitions (job 2): [####################] 13/13 tasks"
    assert lines[2] == "determine partitions: dynamic (hashed shards), 1 time chunk, 1 partition"
