"""`make test` output ends with pytest's summary: nothing printed at interpreter exit.

DuckDB's bindings (nanobind) print "nanobind: leaked N instances!" and a list of types at
exit for every DuckDB object still alive then. Objects stay alive past finalisation when
they are reachable from the frames of a daemon thread still running Python code (Spark's
accumulator server and py4j threads in this suite), so the suite closes its DuckDB
connections where it opens them (``expected_rollup``) and stops the Spark session at the
end of the session (the ``spark`` fixture). This check runs a small pytest session in a
subprocess that imports what the suite imports, does the suite's DuckDB rollup and leaves
a daemon thread running Python code, and asserts that pytest's summary is the last line.
(Handing that thread a DuckDB connection, so that its frame holds one at exit, makes the
check fail with nanobind's lines: checked by hand when writing it.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SESSION = '''
import threading

import aiohttp, prometheus_client, pyarrow, pyspark.sql  # what the suite imports
import shuffled.cli, shuffled.server, shuffled.spark.driver.pipeline
from tests.helpers.ingestion import expected_rollup

GOOD = [{"ms": 1519862400000 + i * 60000, "country": "fr", "device": None, "clicks": i,
         "revenue": 1.5} for i in range(20)]
STOP = threading.Event()


def _linger() -> None:  # like pyspark's accumulator server: Python code running at exit
    while not STOP.wait(0.5):
        pass


def test_rollup_with_a_daemon_thread_running() -> None:
    threading.Thread(target=_linger, daemon=True).start()
    assert expected_rollup(GOOD).num_rows > 0
'''


def test_nothing_printed_after_the_summary(tmp_path: Path) -> None:
    test_file = tmp_path / "test_session.py"
    test_file.write_text(SESSION)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), "-c", str(ROOT / "pyproject.toml"), str(test_file)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert "nanobind" not in out and "leaked" not in out, out[-3000:]
    assert re.fullmatch(r"1 passed in [\d.]+s", lines[-1].strip()), lines[-5:]
