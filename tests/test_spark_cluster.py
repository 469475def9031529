"""The main job on a real Spark standalone cluster: a master and two workers started from
pyspark's own launcher on loopback, with two shuffle daemons."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import pyspark
from shuffled.client import ShuffleClient
from shuffled.server.embedded import EmbeddedDaemon

ROOT = Path(__file__).resolve().parent.parent
SPARK_HOME = Path(pyspark.__file__).resolve().parent
pytestmark = pytest.mark.spark


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:  # only the processes this test started, by pid
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def standalone_cluster(tmp_path: Path) -> Iterator[str]:
    """A master and two 1-core workers on loopback; stopped (by pid) on exit."""
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(tmp_path / "logs")}
    launcher = str(SPARK_HOME / "bin" / "spark-class")
    port, ui = _free_port(), _free_port()
    log = open(tmp_path / "cluster.log", "wb")
    procs = [subprocess.Popen(
        [launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(ui)], env=env, stdout=log, stderr=log)]
    master = f"spark://127.0.0.1:{port}"
    try:
        for i in range(2):
            procs.append(subprocess.Popen(
                [launcher, "org.apache.spark.deploy.worker.Worker", master, "--host",
                 "127.0.0.1", "--cores", "1", "--memory", "1g",
                 "--webui-port", str(_free_port()), "--work-dir", str(tmp_path / f"work{i}")],
                env=env, stdout=log, stderr=log))
        deadline = time.monotonic() + 120
        alive = 0
        while time.monotonic() < deadline:  # bounded wait for both workers to register
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    alive = json.load(r).get("aliveworkers", 0)
            except OSError:
                alive = 0
            if alive == 2:
                break
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.5)  # poll interval
        assert alive == 2, (tmp_path / "cluster.log").read_text(errors="replace")[-3000:]
        yield master
    finally:
        _stop(procs[::-1])
        log.close()


def test_tutorial_on_standalone_cluster_with_two_daemons(cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with EmbeddedDaemon([tmp_path / "d1"], free_space_reserve=0) as one, \
            EmbeddedDaemon([tmp_path / "d2"], free_space_reserve=0) as two:
        proc = subprocess.run(
            [sys.executable, "-m", "shuffled", "ingest",
             "examples/rollup-tutorial/rollup-index.json", "--master", cluster,
             "--shuffle-server", one, "--shuffle-server", two, "--output", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable},
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "SUCCESS" in proc.stdout
        for url in (one, two):  # the supervisor deleted its shuffle data everywhere
            with ShuffleClient(url) as client:
                assert client.list_tasks()["files"] == 0
    files = sorted(out.rglob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    expected = json.loads((ROOT / "examples/rollup-tutorial/expected-rows.json").read_text())
    got = [{**r, "__time": r["__time"].strftime("%Y-%m-%dT%H:%M:%S.000Z")} for r in rows]
    assert sorted(got, key=str) == sorted(expected, key=str)
