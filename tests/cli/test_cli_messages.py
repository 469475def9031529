"""A new user's first hour: each mistake answered by the real command with one
paragraph naming what failed, the setting or file, and what to do, the documented exit
code, and nothing left on disk. Every case runs `python -m shuffled ...` as a subprocess.

Root ignores file permissions and may bind any port: where a case needs a user who cannot,
the command runs under ``setpriv`` with that capability dropped (still root otherwise).
"""

from __future__ import annotations

import json
import os
import pty
import re
import secrets
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.procs import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
SPEC = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())
SPEC["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(ROOT / "examples/rollup-tutorial")


def run(args: list[str], *, cwd: Path = ROOT, drop: str = "", timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m shuffled ARGS``; ``drop`` names capabilities to drop when root."""
    wrapper: list[str] = []
    if drop and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv (util-linux) to drop a capability")
        wrapper = ["setpriv", f"--inh-caps=-{drop}", f"--bounding-set=-{drop}"]
    full = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    full.pop("PYSPARK_SUBMIT_ARGS", None)
    return subprocess.run([*wrapper, sys.executable, "-m", "shuffled", *args], cwd=cwd,
                          env=full, capture_output=True, text=True, timeout=timeout)


def paragraph(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one failure paragraph of `shuffled ingest` (exit ``code``, no traceback)."""
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "Errno" not in done.stderr, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("shuffled ingest failed: "), done.stderr
    assert ". Try: " in lines[0], lines[0]
    return lines[0]


def write_spec(tmp_path: Path, spec: Any = SPEC, name: str = "spec.json") -> Path:
    path = tmp_path / name
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return path


# --- tokens -------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["missing", "wrong"])
def test_a_wrong_or_missing_token_is_named_not_a_dead_server(tmp_path: Path, given: str) -> None:
    token = tmp_path / "daemon-token"
    token.write_text(secrets.token_urlsafe(24))
    extra = []
    if given == "wrong":
        (tmp_path / "mine").write_text(secrets.token_urlsafe(24))
        extra = ["--auth-token-file", str(tmp_path / "mine")]
    with DaemonProcess([tmp_path / "loc"], "--auth-token-file", str(token)) as daemon:
        done = run(["ingest", str(write_spec(tmp_path)), "--shuffle-server", daemon.url,
                    "--output", str(tmp_path / "out"), *extra])
    line = paragraph(done)
    assert daemon.url in line and "401" in line and f"({given} token)" in line, line
    assert "health check" not in line and "start it" not in line, line
    assert "--auth-token-file" in line and "SHUFFLED_AUTH_TOKEN" in line, line
    assert not (tmp_path / "out").exists()  # refused before anything was written


# --- the spec file and --output -----------------------------------------------------------


def test_a_missing_spec_file_names_it(tmp_path: Path) -> None:
    line = paragraph(run(["ingest", "no-such-spec.json"], cwd=tmp_path))
    assert "the spec file no-such-spec.json does not exist" in line and str(tmp_path) in line
    assert "inputSource" not in line and "Try: give the path of a Druid" in line
    assert list(tmp_path.iterdir()) == []


def test_a_spec_that_is_not_json_names_the_file_and_where(tmp_path: Path) -> None:
    path = write_spec(tmp_path, '{"type": "index_parallel",\n "spec": oops}')
    line = paragraph(run(["ingest", str(path)], cwd=tmp_path))
    assert f"the spec file {path} is not JSON" in line and "line 2 column" in line, line
    assert f"Try: fix the JSON in {path}" in line and "--verbose" not in line


def test_a_misspelled_field_names_the_wrong_name_given(tmp_path: Path) -> None:
    spec = json.loads(json.dumps(SPEC))
    schema = spec["spec"]["dataSchema"]
    schema["dimensionSpec"] = schema.pop("dimensionsSpec")
    path = write_spec(tmp_path, spec)
    line = paragraph(run(["ingest", str(path), "--output", str(tmp_path / "out")]))
    assert f"{path}: $.spec.dataSchema.dimensionsSpec: is required" in line, line
    assert "'dimensionSpec' instead: rename it to 'dimensionsSpec'" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["proc", "under-a-file", "read-only-dir"])
def test_an_output_that_cannot_be_written_names_output(tmp_path: Path, where: str) -> None:
    drop = ""
    if where == "proc":
        output = "/proc/shuffled-out"
    elif where == "under-a-file":
        (tmp_path / "a-file").write_text("x")
        output = str(tmp_path / "a-file" / "segments")
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        output, drop = str(ro / "segments"), "dac_override,-dac_read_search"
    line = paragraph(run(["ingest", str(write_spec(tmp_path)), "--output", output],
                         drop=drop))
    assert f"--output {output} cannot be " in line, line
    assert "Try: give --output a directory this user can write" in line, line
    assert "inputSource" not in line
    assert not os.path.exists(output)
    if where == "read-only-dir":
        assert list((tmp_path / "ro").iterdir()) == []


def test_bad_conf_is_a_usage_error_naming_conf(tmp_path: Path) -> None:
    for value, says in (("spark.executor.memory", "is not KEY=VALUE"),
                        ("executor.memory=4g", "is not a Spark setting")):
        done = run(["ingest", str(write_spec(tmp_path)), "--conf", value])
        assert done.returncode == 2 and "argument --conf" in done.stderr and says in \
            done.stderr, done.stderr


def test_help_describes_the_program_not_its_code() -> None:
    done = run(["--help"])
    assert done.returncode == 0
    assert "the only place touching argv" not in done.stdout
    for words in ("shuffled serve", "shuffled ingest", "Exit codes", "docs/design.md"):
        assert words in done.stdout, words
    ingest = run(["ingest", "--help"]).stdout
    assert "--conf KEY=VALUE" in ingest and "spark-submit" in ingest


# --- shuffled serve -----------------------------------------------------------------------


def serve_failure(done: subprocess.CompletedProcess[str]) -> str:
    """`shuffled serve`'s one line for a bad setting: exit 2, nothing logged before it."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stdout == ""
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("shuffled: configuration error: "), lines
    assert "Errno" not in lines[0] and "apscheduler" not in done.stderr
    return lines[0]


def test_serve_on_a_port_in_use_names_the_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = serve_failure(run(["serve", "--host", "127.0.0.1", "--port", str(port),
                                  "--location", str(tmp_path / "loc")], timeout=60))
    assert f"port: 127.0.0.1:{port} is already in use" in line and "--port" in line, line
    assert not (tmp_path / "loc").exists()  # bound before any location was opened


def test_serve_on_a_privileged_port_names_the_port(tmp_path: Path) -> None:
    start = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
    if start.exists() and int(start.read_text()) <= 80:
        pytest.skip("port 80 is not privileged on this machine")
    line = serve_failure(run(["serve", "--host", "127.0.0.1", "--port", "80", "--location",
                              str(tmp_path / "loc")], drop="net_bind_service", timeout=60))
    assert "port: 80 is a privileged port" in line and "--port 1024 or above" in line, line
    assert not (tmp_path / "loc").exists()


def test_serve_with_a_location_that_is_a_file_says_so(tmp_path: Path) -> None:
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    line = serve_failure(run(["serve", "--host", "127.0.0.1", "--port", "0",
                              "--location", str(afile)], timeout=60))
    assert f"locations: {afile} is a file, not a directory" in line, line
    assert "give --location a directory" in line and "File exists" not in line
    assert afile.read_text() == "x"


# --- a successful run on a terminal -------------------------------------------------------


def _on_a_terminal(args: list[str], cwd: Path, env: dict[str, str],
                   timeout: float) -> tuple[int, str]:
    """Run ``args`` with stdout and stderr on a pseudo-terminal; (exit code, what it showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, close_fds=True)
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(master)
    return code, shown.decode("utf-8", "replace")


def test_demo_on_a_terminal_is_quiet_full_and_says_where_things_went(tmp_path: Path) -> None:
    """`make demo` (`python -m shuffled.demo`) runs `shuffled ingest`: on a terminal it
    shows no Spark banner or WARN line, each bar ends full, counts take the right number,
    the summary names the segments, manifest and report, `--conf` reaches Spark, and the
    temporary directory is left as it was (no shuffled-log4j-* or other leftovers)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    events = tmp_path / "events"
    events.mkdir()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(scratch)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    code, shown = _on_a_terminal(
        [sys.executable, "-m", "shuffled.demo", "--conf", "spark.eventLog.enabled=true",
         "--conf", f"spark.eventLog.dir=file://{events}", "--conf", "spark.eventLog.compress=false",
         "--conf", "spark.shuffled.firstHour=conf reached Spark"],
        cwd=tmp_path, env=env, timeout=400)
    assert code == 0, shown[-3000:]
    for noise in ("WARN", "Setting default log level", "sc.setLogLevel", "Traceback"):
        assert noise not in shown, (noise, shown[-3000:])
    bars = re.findall(r"\[([#.]{20})\] (\d+)/(\d+) tasks", shown)
    assert bars, shown[-3000:]
    for phase in ("determine partitions", "phase 1 (partial segments)", "phase 2 (merge)"):
        last = shown.rsplit(f"{phase}: [", 1)[1][:40]
        done = re.match(r"([#.]{20})\] (\d+)/(\d+) tasks", last)
        assert done and done.group(1) == "#" * 20 and done.group(2) == done.group(3), last
    assert "1 time chunk, 1 partition\r" in shown or "1 time chunk, 1 partition\n" in shown
    assert "time chunks" not in shown and "1 partitions" not in shown
    out = tmp_path / "demo-output" / "rollup-tutorial"
    assert f"segments: 1 segment under {out}" in shown, shown[-2000:]
    assert f"manifest: {out / 'manifest.json'}" in shown and (out / "manifest.json").is_file()
    assert f"task report: {out / 'task-report.json'}" in shown
    assert (out / "task-report.json").is_file()
    logs = [p for p in events.rglob("*") if p.is_file()]  # a file, or a rolling log's dir
    assert logs and any("conf reached Spark" in p.read_text(errors="replace") for p in logs)
    assert list(scratch.iterdir()) == [], list(scratch.iterdir())
    shutil.rmtree(tmp_path / "demo-output")
