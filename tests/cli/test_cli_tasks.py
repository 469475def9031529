"""Issue 39's tools, run as a user would (``python -m shuffled ...`` subprocesses against
a real daemon): ``shuffled tasks ls|show|rm``, a daemon URL checked as an argument (exit
2), and the warning of ``serve`` listening beyond loopback with no token."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey
from tests.conftest import arrow_bytes, sample_table
from tests.helpers.procs import DaemonProcess, first_line

ROOT = Path(__file__).resolve().parents[2]


def shuffled(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shuffled", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> DaemonProcess:
    base = tmp_path_factory.mktemp("tasks-cli")
    token = secrets.token_hex(16)
    (base / "token").write_text(token)
    with DaemonProcess([base / "a"], "--auth-token-file", str(base / "token"),
                       log_path=base / "daemon.log") as proc:
        with ShuffleClient(proc.url, token=token) as c:
            for i, sup in enumerate(["ingest_a", "ingest_a", "ingest_b"]):
                c.put_partial(PartialKey(sup, f"s{i}", Interval(0, 86_400_000), 0),
                              arrow_bytes(sample_table(1000 + i, seed=i)))
        proc.token_file = base / "token"  # type: ignore[attr-defined]
        yield proc


def test_ls_lists_each_task_with_partials_bytes_and_expiry(daemon: DaemonProcess) -> None:
    done = shuffled("tasks", "ls", "--shuffle-server", daemon.url,
                    "--auth-token-file", str(daemon.token_file))  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.match(rf"{re.escape(daemon.url)}: 2 task\(s\), 3 partials, [\d,]+ bytes$",
                    lines[0]), lines[0]
    assert lines[1].split() == ["TASK", "PARTIALS", "BYTES", "EXPIRES", "IN"]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert rows["ingest_a"][1] == "2" and rows["ingest_b"][1] == "1"
    assert all("," in r[2] for r in rows.values())  # 1,234: one number format
    assert re.fullmatch(r"\d+m\d\ds", rows["ingest_a"][3])


def test_show_prints_the_task_and_rm_removes_it(daemon: DaemonProcess) -> None:
    token = ["--auth-token-file", str(daemon.token_file)]  # type: ignore[attr-defined]
    done = shuffled("tasks", "show", "ingest_b", "--shuffle-server", daemon.url, *token)
    assert done.returncode == 0, done.stderr
    detail = json.loads(done.stdout)
    assert detail["supervisorTaskId"] == "ingest_b" and detail["files"] == 1
    done = shuffled("tasks", "rm", "ingest_b", "never_held", "--shuffle-server", daemon.url,
                    *token)
    assert done.returncode == 0, done.stderr
    assert re.search(r"removed ingest_b: 1 partials, [\d,]+ bytes", done.stdout)
    assert "never_held was not held" in done.stdout
    gone = shuffled("tasks", "show", "ingest_b", "--shuffle-server", daemon.url, *token)
    assert gone.returncode == 1 and "holds no data of supervisor task ingest_b" in gone.stderr


def test_a_wrong_token_and_bad_arguments_are_named(daemon: DaemonProcess,
                                                   tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    done = shuffled("tasks", "ls", "--shuffle-server", daemon.url, "--auth-token-file",
                    str(wrong))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{daemon.url} refused the token in --auth-token-file {wrong}" in done.stderr
    done = shuffled("tasks", "show", "--shuffle-server", daemon.url)
    assert done.returncode == 2 and "exactly one supervisor task id" in done.stderr


@pytest.mark.parametrize("command", [["tasks", "ls"], ["ingest", "spec.json"]])
def test_a_shuffle_server_that_is_not_a_url_is_a_usage_error(command: list[str]) -> None:
    """``--shuffle-server 127.0.0.1:18193`` raised a ValueError (exit 1, "--verbose")."""
    done = shuffled(*command, "--shuffle-server", "127.0.0.1:18193")
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]  # argparse's usage, then the error
    assert "is not a daemon URL: give http://HOST:PORT" in error, error
    assert "Traceback" not in done.stderr


def test_serve_beyond_loopback_without_a_token_warns(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "shuffled", "serve", "--host", "0.0.0.0", "--port", "0",
         "--location", str(tmp_path / "a"), "--access-log", "false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert (first_line(proc) or "").startswith("shuffled listening on")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "warning: listening on 0.0.0.0 with no token" in err.decode()
    quiet = DaemonProcess([tmp_path / "b"], log_path=tmp_path / "quiet.log")
    with quiet:
        pass
    assert "warning" not in quiet.log_tail()  # loopback: no warning
