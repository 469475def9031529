"""The main job on a real Spark standalone cluster: a master and two workers started from
pyspark's own launcher on loopback, with two shuffle daemons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shuffled.client import ShuffleClient
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import metric

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark


def test_tutorial_on_standalone_cluster_with_two_daemons(cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    one_daemon = EmbeddedDaemon([tmp_path / "d1"], free_space_reserve=0)
    two_daemon = EmbeddedDaemon([tmp_path / "d2"], free_space_reserve=0)
    with one_daemon as one, two_daemon as two:
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
        # One node's two disks, a daemon each, both given to the driver (docs/ops.md, "A
        # node's cores and disks"): the node's daemons took phase 1's output (five rows
        # may all land on one of them).
        assert sum(metric(d.registry, "shuffled_received_bytes_total")
                   for d in (one_daemon, two_daemon)) > 0
    files = sorted(out.rglob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    expected = json.loads((ROOT / "examples/rollup-tutorial/expected-rows.json").read_text())
    got = [{**r, "__time": r["__time"].strftime("%Y-%m-%dT%H:%M:%S.000Z")} for r in rows]
    assert sorted(got, key=str) == sorted(expected, key=str)
