"""A Spark standalone cluster on loopback: a master and two workers started from pyspark's own
launcher (the session's ``cluster`` fixture, tests/conftest.py).

Every port is the kernel's choice (port 0), read back from the master's log: a port picked
by binding and releasing it could be taken by another test's process before the JVM bound
it. The master's REST submission server, which binds a fixed port (6066), is off."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark


SPARK_HOME = Path(pyspark.__file__).resolve().parent


_BOUND = {"master": re.compile(rb"Starting Spark master at spark://127\.0\.0\.1:(\d+)"),
          "ui": re.compile(rb"Successfully started service 'MasterUI' on port (\d+)")}


def _ports(log: Path, master: subprocess.Popen, deadline: float) -> dict[str, int]:
    """The master's RPC and web UI ports, as its log reports them once bound."""
    found: dict[str, int] = {}
    while time.monotonic() < deadline and master.poll() is None:
        text = log.read_bytes()
        found = {k: int(m.group(1)) for k, rx in _BOUND.items() if (m := rx.search(text))}
        if len(found) == len(_BOUND):
            return found
        time.sleep(0.2)  # poll interval
    raise AssertionError(f"the master did not report its ports {sorted(set(_BOUND) - set(found))}:"
                         f"\n{log.read_text(errors='replace')[-3000:]}")


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
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(tmp_path / "logs"),
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    launcher = str(SPARK_HOME / "bin" / "spark-class")
    master_log = tmp_path / "master.log"
    deadline = time.monotonic() + 120
    with open(master_log, "wb") as out:
        procs = [subprocess.Popen(
            [launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", "0", "--webui-port", "0"], env=env, stdout=out, stderr=out)]
    log = open(tmp_path / "cluster.log", "wb")
    try:
        ports = _ports(master_log, procs[0], deadline)
        master, ui = f"spark://127.0.0.1:{ports['master']}", ports["ui"]
        for i in range(2):
            procs.append(subprocess.Popen(
                [launcher, "org.apache.spark.deploy.worker.Worker", master, "--host",
                 "127.0.0.1", "--cores", "1", "--memory", "1g", "--port", "0",
                 "--webui-port", "0", "--work-dir", str(tmp_path / f"work{i}")],
                env=env, stdout=log, stderr=log))
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
        assert alive == 2, (master_log.read_text(errors="replace")[-2000:]
                            + (tmp_path / "cluster.log").read_text(errors="replace")[-3000:])
        yield master
    finally:
        _stop(procs[::-1])
        log.close()
