"""Smoke run of the benchmark harness (``python -m bench --quick``): shape, not speed.

It starts real nginx and daemons on loopback with tiny sizes and checks that every
comparison ran and ``results.json`` has the documented fields. Timing is never asserted
(this machine is shared); the end-to-end Spark comparisons (5 and 7) are left out (they
need a JVM and far longer than a smoke test may take).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"name", "ours", "baseline", "unit", "ratio", "target", "met"}

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None and not os.access("/usr/sbin/nginx", os.X_OK),
    reason="nginx is not installed (make sysdeps-bench installs it); the bench compares against it")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is the bench's shared client")
def test_quick_bench_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    readme = tmp_path / "README.md"
    readme.write_text("# x\n")
    done = subprocess.run(
        # The Spark-shaped comparisons (e2e, determining, and the Druid shape's druid,
        # druid_json and iceberg) are skipped: each is a Spark run of its own, tens of
        # seconds even quick; the harness they share with the rest is exercised here.
        [sys.executable, "-m", "bench", "--quick", "--skip", "e2e", "--skip", "druid",
         "--skip", "druid_json", "--skip", "iceberg", "--skip", "determining",
         "--out", str(out),
         "--readme", str(readme), "--write-readme", "--workdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert isinstance(results, list)
    names = {r["name"] for r in results}
    assert {"serve_large_throughput", "serve_large_cpu", "serve_small_aggregate",
            "ingest_large_durable", "ingest_small_durable", "ingest_small_nofsync",
            "ingest_small_bulk", "serve_small_cpu", "ingest_small_cpu", "memory_flat", "memory_peak_rss", "scale_rss",
            "scale_restart_early", "scale_fill_rss", "scale_restart", "scale_first_page", "scale_fill_rate",
            "merge_seconds", "merge_rss_budget", "ingest_small_slab", "ingest_small_slab_cpu",
            "serve_small_shard", "serve_small_shard_cpu", "ingest_small_durable_cpu",
            "ingest_small_slab_cpu_nginx"} <= names
    scale = next(r for r in results if r["name"] == "scale_rss")["detail"]
    assert scale["partials"] > 0 and scale["fill"]["stored"] == scale["partials"]
    # The early restart was measured on the way there, and the fill went on after it.
    assert scale["early"]["complete"] and 0 < scale["early"]["stored"] < scale["partials"]
    assert len(scale["early_ready_s"]) == len(scale["samples"]["ready_s"])
    for r in results:
        assert FIELDS <= set(r), r
        assert isinstance(r["ours"], (int, float)) and math.isfinite(r["ours"]) and r["ours"] > 0
        assert r["met"] in (True, False, None)
        if r["baseline"] and r["ratio"] is not None:
            assert r["ratio"] == pytest.approx(r["ours"] / r["baseline"])
        if r["met"] is not None:
            assert r["target"]
    meta = json.loads((tmp_path / "results-meta.json").read_text())
    assert meta["quick"] is True and meta["machine"]["cores"]
    # Each daemon of comparisons 1-4 has its peak RSS per step, the "rest" last.
    steps = meta["daemon_step_peaks_mib"]
    assert list(steps["serve_small"]) == ["bulk upload", "warm-up GETs", "GETs", "rest"]
    assert all(v > 0 for v in steps["serve_small"].values())
    text = readme.read_text()
    assert "## Benchmarks" in text and "<!-- bench:start -->" in text
    assert "| comparison |" in text and "<!-- bench:end -->" in text
    assert "| serve_large" not in done.stdout  # titles, not internal names, in the table
    assert not list(tmp_path.glob("shuffled-bench-*")), "scratch directory left behind"
