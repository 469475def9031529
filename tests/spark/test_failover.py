"""Lose a shuffle daemon, keep the ingestion: a real standalone cluster (master and two
workers from pyspark's own launcher on loopback) and, per scenario, three real daemon
processes. Daemons are SIGKILLed during phase 1 and between the phases, SIGTERMed and
restarted during phase 2, with and without replicas; every run's segments equal DuckDB's
rollup of the input and the task report says what was recomputed. A run that loses every
daemon ends with one paragraph and exit code 1. All scenarios run in one Spark application
(tests/helpers/failover_driver.py): executors start once, for the scenarios of the tests
selected. ``make test`` runs the two on the late plan's slabs (what a native-reader spec
takes); the others are ``slow`` (``make soak``): 88 s of the suite's 15 minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ingestion import (
    assert_matches, expected_rollup, generate, read_output, write_parts,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark

SCENARIOS = [
    # The partials (the JVM reader; numShards read natively goes as slabs, as below).
    {"name": "phase1_kill", "kill_in_phase1": [0], "reader": "jvm"},
    {"name": "between_kill", "kill_between": [1]},
    {"name": "phase2_restart", "term_in_phase2": 0},
    {"name": "replicas", "kill_between": [0], "tuning": {"shuffleReplicas": 2}},
    {"name": "deep_kill", "kill_after_seal": [1], "deep": True,
     "tuning": {"shuffleDurability": "deep"}},
    {"name": "all_gone", "kill_in_phase1": [0, 1, 2], "cli": True},
    # The spec Druid recommends (no numShards): the late plan's slabs (docs/slab.md).
    {"name": "late_phase1_kill", "kill_in_phase1": [0],
     "partitions": {"type": "hashed", "targetRowsPerSegment": 400}},
    {"name": "late_phase2_restart", "term_in_phase2": 0,
     "partitions": {"type": "hashed", "targetRowsPerSegment": 400}},
]


SCENARIO_OF = {  # test -> the scenario it reads
    "test_sigkill_during_phase1_recomputes_only_the_lost_subtasks": "phase1_kill",
    "test_sigkill_between_the_phases_recomputes_before_phase2": "between_kill",
    "test_sigterm_and_restart_during_phase2_rides_through": "phase2_restart",
    "test_the_late_plan_rides_through_a_daemon_restart_in_phase2": "late_phase2_restart",
    "test_the_late_plan_rides_through_a_sigkill_in_phase1": "late_phase1_kill",
    "test_two_replicas_survive_a_sigkill_without_recompute": "replicas",
    "test_a_daemon_lost_after_a_deep_seal_costs_no_recompute": "deep_kill",
    "test_losing_every_daemon_ends_in_one_paragraph": "all_gone",
}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         cluster: str) -> Iterator[tuple[dict[str, Any], Any]]:
    """The selected tests' scenarios' results (one driver process on one cluster) and
    DuckDB's rollup."""
    wanted = {SCENARIO_OF[item.name] for item in request.session.items
              if item.module is request.module}
    assert wanted, "no scenario selected"
    root = tmp_path_factory.mktemp("failover")
    lines, good, _ = generate(12_000, seed=7)
    write_parts(lines, root / "input", parts=4)
    args = root / "args.json"
    args.write_text(json.dumps({"input": str(root / "input"), "root": str(root / "runs"),
                                "scenarios": [sc for sc in SCENARIOS if sc["name"] in wanted],
                                "master": cluster}))
    results = root / "results.json"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "failover_driver.py"),
                           str(args), str(results)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    yield json.loads(results.read_text()), expected_rollup(good)


def _succeeded(run: dict[str, Any], expected: Any) -> dict[str, Any]:
    assert "error" not in run, run.get("error")
    report = run["report"]
    assert report["status"] == "SUCCESS"
    _, out = read_output(Path(run["output"]))
    assert_matches(out, expected)  # row for row DuckDB's rollup of the input
    assert all(n == 0 for n in run["held"].values()), run["held"]  # survivors: deleted
    return report


@pytest.mark.slow
def test_sigkill_during_phase1_recomputes_only_the_lost_subtasks(runs: Any) -> None:
    results, expected = runs
    run = results["phase1_kill"]
    report = _succeeded(run, expected)
    assert run["victimExit"] == [-9]
    victim = run["urls"][0]
    rec = report["recovery"]
    assert list(rec["lostDaemons"]) == [victim] and report["cleanup"][victim] == "lost"
    assert 1 <= rec["subtasksRecomputed"] < len(report["subtasks"])  # only those with loss
    assert report["phases"]["partialSegmentGeneration"]["failovers"] >= 1


@pytest.mark.slow
def test_sigkill_between_the_phases_recomputes_before_phase2(runs: Any) -> None:
    results, expected = runs
    run = results["between_kill"]
    report = _succeeded(run, expected)
    rec = report["recovery"]
    assert list(rec["lostDaemons"]) == [run["urls"][1]]
    assert rec["rounds"][0]["when"] == "after phase 1" and rec["subtasksRecomputed"] >= 1
    assert rec["partitionsRemerged"] == 0  # found before phase 2 read anything


@pytest.mark.slow
def test_sigterm_and_restart_during_phase2_rides_through(runs: Any) -> None:
    results, expected = runs
    run = results["phase2_restart"]
    assert run["restarted"] and "restartError" not in run
    report = _succeeded(run, expected)
    rec = report["recovery"]
    assert rec["lostDaemons"] == {} and rec["subtasksRecomputed"] == 0


def test_the_late_plan_rides_through_a_daemon_restart_in_phase2(runs: Any) -> None:
    """A daemon SIGTERMed while phase 2 reads its slabs comes back on its location: its
    slabs are files whose rows the start rebuilds, the readers retry through the restart,
    and every row is published once."""
    results, expected = runs
    run = results["late_phase2_restart"]
    assert run["restarted"] and "restartError" not in run
    report = _succeeded(run, expected)
    assert report["phases"]["determinePartitions"]["method"] == "latePlan"
    assert report["recovery"]["lostDaemons"] == {}


def test_the_late_plan_rides_through_a_sigkill_in_phase1(runs: Any) -> None:
    """The late plan keeps one copy of each slab: the subtasks that stored slabs on the
    killed daemon run again on the survivors (docs/slab.md, "A lost daemon"); every row
    is published once, on the cluster as in local mode (tests/spark/slab/
    test_late_recovery.py)."""
    results, expected = runs
    run = results["late_phase1_kill"]
    assert run["victimExit"] == [-9]
    report = _succeeded(run, expected)
    assert report["phases"]["determinePartitions"]["method"] == "latePlan"
    rec = report["recovery"]
    assert list(rec["lostDaemons"]) == [run["urls"][0]]
    assert 1 <= rec["subtasksRecomputed"] <= len(report["subtasks"])


@pytest.mark.slow
def test_two_replicas_survive_a_sigkill_without_recompute(runs: Any) -> None:
    results, expected = runs
    run = results["replicas"]
    report = _succeeded(run, expected)
    rec = report["recovery"]
    assert list(rec["lostDaemons"]) == [run["urls"][0]] and rec["subtasksRecomputed"] == 0
    phase1 = report["phases"]["partialSegmentGeneration"]
    assert phase1["replicas"] == 2
    assert phase1["bytesReplicated"] == phase1["bytesShuffled"] > 0  # each partial twice


@pytest.mark.slow
def test_a_daemon_lost_after_a_deep_seal_costs_no_recompute(runs: Any) -> None:
    """shuffleDurability deep: the seal counted once every daemon's copy was in deep
    storage; the daemon SIGKILLed then is read from the tier through the survivors."""
    results, expected = runs
    run = results["deep_kill"]
    report = _succeeded(run, expected)
    assert run["victimExit"] == [-9]
    victim = run["urls"][1]
    rec = report["recovery"]
    assert list(rec["lostDaemons"]) == [victim]
    assert rec["subtasksRecomputed"] == 0 and rec["readFromTier"] == [victim]
    # Found by the driver's look before phase 2 (it waited for the copies), or by the merge
    # tasks' reads: either way read from the tier.
    assert [r["when"] for r in rec["rounds"]] in (["before phase 2"], ["during phase 2"])
    # The driver's DELETE left nothing in the bucket: the victim's share went with it.
    assert run["tierLeft"] == [], run["tierLeft"][:5]


@pytest.mark.slow
def test_losing_every_daemon_ends_in_one_paragraph(runs: Any) -> None:
    results, _ = runs
    run = results["all_gone"]
    assert run["exitCode"] == 1, run["stdout"][-2000:] + run["stderr"][-2000:]
    shown = run["stdout"] + run["stderr"]
    assert "Traceback" not in shown
    assert "no shuffle daemon is left" in run["stderr"] and "task report" in run["stderr"]
    report = run["report"]
    assert report["status"] == "FAILED" and "no shuffle daemon is left" in report["errorMsg"]
    assert sorted(report["recovery"]["lostDaemons"]) == sorted(run["urls"])
