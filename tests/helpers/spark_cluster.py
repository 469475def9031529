"""A Spark standalone cluster on loopback: a master and two workers started from pyspark's own
launcher (the session's ``cluster`` fixture, tests/conftest.py)."""

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

import pyspark


SPARK_HOME = Path(pyspark.__file__).resolve().parent


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
            except (OSError, ValueError):
                # ValueError: the UI was bound before the master became leader, and its
                # /json/ answered an HTML page (seen under pytest-xdist's load).
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
